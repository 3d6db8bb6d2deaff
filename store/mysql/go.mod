module github.com/idemkey/idemkey/store/mysql

go 1.26.0

require (
	github.com/go-sql-driver/mysql v1.10.1
	github.com/idemkey/idemkey v0.0.0-20261203201705-bb524189222e
)

require (
	filippo.io/edwards25519 v1.2.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
)

// Until the modules are tagged, build against the ones in this repository.
replace github.com/idemkey/idemkey => ../..
