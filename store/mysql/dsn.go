package mysql

import (
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/go-sql-driver/mysql"
)

// DSN turns a URL of the form mysql://user[:password]@host[:port]/database
// (the form MYSQL_URL holds, as idemctl and the examples take it) into the
// data source name github.com/go-sql-driver/mysql opens: TCP to host and
// port (3306 by default). Query parameters pass through as the driver's
// DSN parameters (for example ?tls=true&timeout=2s), and must be ones it
// knows. The user name and password may be percent-encoded.
//
// A string without "://" is taken as a DSN of the driver's own
// (user:password@tcp(host:3306)/database?param=value): it is returned as
// it is, once the driver has parsed it, so that a service can hold either
// form in one setting.
func DSN(rawURL string) (string, error) {
	if !strings.Contains(rawURL, "://") {
		if _, err := mysql.ParseDSN(rawURL); err != nil {
			return "", fmt.Errorf("idemkey: mysql: DSN: neither a mysql:// URL nor a DSN the driver takes: %w", err)
		}
		return rawURL, nil
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", fmt.Errorf("idemkey: mysql: DSN: %w", err)
	}
	if u.Scheme != "mysql" && u.Scheme != "mariadb" {
		return "", fmt.Errorf("idemkey: mysql: DSN: scheme %q, want mysql://user[:password]@host[:port]/database", u.Scheme)
	}
	if u.Host == "" {
		return "", fmt.Errorf("idemkey: mysql: DSN: %q has no host", redact(u))
	}
	cfg := mysql.NewConfig()
	if u.User != nil {
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
	}
	cfg.Net = "tcp"
	host, port := u.Hostname(), u.Port()
	if port == "" {
		port = "3306"
	}
	cfg.Addr = net.JoinHostPort(host, port)
	cfg.DBName = strings.TrimPrefix(u.Path, "/")
	if strings.Contains(cfg.DBName, "/") {
		return "", fmt.Errorf("idemkey: mysql: DSN: %q: the path must be one database name", redact(u))
	}
	dsn := cfg.FormatDSN()
	if u.RawQuery != "" {
		sep := "?"
		if strings.Contains(dsn, "?") {
			sep = "&"
		}
		dsn += sep + u.RawQuery
	}
	// The driver checks what it would open.
	if _, err := mysql.ParseDSN(dsn); err != nil {
		return "", fmt.Errorf("idemkey: mysql: DSN: %q: %w", redact(u), err)
	}
	return dsn, nil
}

// redact is u without its password, for messages.
func redact(u *url.URL) string {
	return u.Redacted()
}
