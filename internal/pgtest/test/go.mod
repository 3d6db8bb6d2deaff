// Module test holds internal/pgtest's own tests, which drive the servers
// it starts with pgx: a module of its own, so that pgx stays out of the
// root module, where the harness is, and no user's graph has this module.
module github.com/idemkey/idemkey/internal/pgtest/test

go 1.26.0

require (
	github.com/idemkey/idemkey v0.0.0-20261203201705-bb524189222e
	github.com/jackc/pgx/v5 v5.12.0
)

require (
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	golang.org/x/sync v0.22.0 // indirect
	golang.org/x/text v0.41.0 // indirect
)

// Until the modules are tagged, build against the ones in this repository.
replace github.com/idemkey/idemkey => ../../..
