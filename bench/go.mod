module github.com/idemkey/idemkey/bench

go 1.26.0

require (
	github.com/go-sql-driver/mysql v1.10.1
	github.com/idemkey/idemkey v0.0.0-20261203201705-bb524189222e
	github.com/idemkey/idemkey/store/mysql v0.0.0-20261203201705-bb524189222e
	github.com/idemkey/idemkey/store/postgres v0.0.0-20261203201705-bb524189222e
	github.com/idemkey/idemkey/store/redis v0.0.0-20261203201705-bb524189222e
	github.com/jackc/pgx/v5 v5.12.0
	github.com/redis/go-redis/v9 v9.23.0
)

require (
	filippo.io/edwards25519 v1.2.0 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sync v0.23.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/text v0.42.0 // indirect
)

// Until the modules are tagged, build against the ones in this repository.
replace (
	github.com/idemkey/idemkey => ../
	github.com/idemkey/idemkey/store/mysql => ../store/mysql
	github.com/idemkey/idemkey/store/postgres => ../store/postgres
	github.com/idemkey/idemkey/store/redis => ../store/redis
)
