module github.com/idemkey/idemkey/datalayers

go 1.26.0

require (
	github.com/go-sql-driver/mysql v1.10.1
	github.com/idemkey/idemkey v0.0.0-20261203201705-bb524189222e
	github.com/idemkey/idemkey/store/mysql v0.0.0-20261203201705-bb524189222e
	github.com/idemkey/idemkey/store/postgres v0.0.0-20261203201705-bb524189222e
	github.com/jackc/pgx/v5 v5.12.0
	github.com/jmoiron/sqlx v1.4.0
	github.com/lib/pq v1.10.9
	github.com/uptrace/bun v1.3.0
	github.com/uptrace/bun/dialect/mysqldialect v1.3.0
	github.com/uptrace/bun/dialect/pgdialect v1.3.0
	gorm.io/driver/mysql v1.6.0
	gorm.io/driver/postgres v1.6.3
	gorm.io/gorm v1.31.2
)

require (
	filippo.io/edwards25519 v1.2.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/jinzhu/inflection v1.0.0 // indirect
	github.com/jinzhu/now v1.1.5 // indirect
	github.com/puzpuzpuz/xsync/v3 v3.5.1 // indirect
	github.com/tmthrgd/go-hex v0.0.0-20190904060850-447a3041c3bc // indirect
	github.com/vmihailenco/msgpack/v5 v5.4.1 // indirect
	github.com/vmihailenco/tagparser/v2 v2.0.0 // indirect
	golang.org/x/mod v0.41.0 // indirect
	golang.org/x/sync v0.23.0 // indirect
	golang.org/x/sys v0.41.0 // indirect
	golang.org/x/text v0.42.0 // indirect
)

// Until the modules are tagged, build against the ones in this repository.
replace (
	github.com/idemkey/idemkey => ../
	github.com/idemkey/idemkey/store/mysql => ../store/mysql
	github.com/idemkey/idemkey/store/postgres => ../store/postgres
)
