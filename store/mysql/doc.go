// Package mysql is the idempotency store for MySQL and MariaDB.
package mysql
