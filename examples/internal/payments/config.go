package payments

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
)

// Defaults of the environment.
const (
	// DefaultAddr is where the service listens when ADDR is unset.
	DefaultAddr = "127.0.0.1:8080"
	// DefaultBankDelay is how long the simulated bank takes to make a
	// transfer when BANK_DELAY is unset.
	DefaultBankDelay = 200 * time.Millisecond
)

// Config is the service's configuration, read from the environment by
// ParseEnv.
type Config struct {
	// Addr is the host:port the service listens on (ADDR). Default
	// DefaultAddr; port 0 picks a free port.
	Addr string
	// RedisURL is a redis:// or rediss:// URL (REDIS_URL). Empty: no
	// standalone Redis.
	RedisURL string
	// RedisClusterAddrs are the seed nodes of a Redis Cluster
	// (REDIS_CLUSTER_ADDRS, comma-separated host:port). Empty: no cluster.
	// With neither RedisURL nor RedisClusterAddrs (nor DatabaseURL) the
	// service keeps its keys in memory.
	RedisClusterAddrs []string
	// DatabaseURL is a postgres:// or mysql:// URL (DATABASE_URL: for
	// MySQL and MariaDB, mysql://user[:password]@host:port/database). Set, the service
	// keeps its idempotency records and its payments in that database,
	// and each payment commits with its kept answer in one transaction.
	// Empty: no database. It cannot be combined with Redis.
	DatabaseURL string
	// PaymentDelay is how long POST /payments waits after making the
	// payment and before answering (PAYMENT_DELAY, a Go duration such as
	// "3s"): inside the request's transaction with DatabaseURL, so that a
	// process killed meanwhile leaves no payment. Default 0; negative is
	// an error. Past the route's 5 s deadline the payment is undone and
	// answered 503. PUT /profile waits as long after saving the profile.
	PaymentDelay time.Duration
	// BankDelay is how long the simulated bank takes per transfer
	// (BANK_DELAY, a Go duration such as "200ms" or "5s"). Default
	// DefaultBankDelay; 0 answers at once; negative is an error.
	BankDelay time.Duration
	// LogLevel is the lowest level logged (LOG_LEVEL: debug, info, warn or
	// error). Default info; at debug every idempotency decision (first
	// attempt, kept, replay, released) is logged too.
	LogLevel slog.Level
}

// ParseEnv reads the Config from the environment through getenv (os.Getenv
// in main; a map in tests). It returns an error naming the variable when a
// value is malformed, and when more than one store is chosen (REDIS_URL,
// REDIS_CLUSTER_ADDRS, DATABASE_URL).
func ParseEnv(getenv func(string) string) (Config, error) {
	c := Config{Addr: DefaultAddr, BankDelay: DefaultBankDelay}
	if v := strings.TrimSpace(getenv("ADDR")); v != "" {
		c.Addr = v
	}
	c.RedisURL = strings.TrimSpace(getenv("REDIS_URL"))
	for a := range strings.SplitSeq(getenv("REDIS_CLUSTER_ADDRS"), ",") {
		if a = strings.TrimSpace(a); a != "" {
			c.RedisClusterAddrs = append(c.RedisClusterAddrs, a)
		}
	}
	if c.RedisURL != "" && len(c.RedisClusterAddrs) > 0 {
		return Config{}, errors.New("set REDIS_URL or REDIS_CLUSTER_ADDRS, not both")
	}
	c.DatabaseURL = strings.TrimSpace(getenv("DATABASE_URL"))
	if c.DatabaseURL != "" && (c.RedisURL != "" || len(c.RedisClusterAddrs) > 0) {
		return Config{}, errors.New("set DATABASE_URL or REDIS_URL (or REDIS_CLUSTER_ADDRS), not both: with DATABASE_URL the idempotency records live in the database (PostgreSQL, MySQL or MariaDB), in the payments' own transactions")
	}
	if v := strings.TrimSpace(getenv("PAYMENT_DELAY")); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			return Config{}, fmt.Errorf("PAYMENT_DELAY: %q is not a Go duration such as 500ms or 3s", v)
		}
		if d < 0 {
			return Config{}, fmt.Errorf("PAYMENT_DELAY: %v is negative", d)
		}
		c.PaymentDelay = d
	}
	if v := strings.TrimSpace(getenv("BANK_DELAY")); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			return Config{}, fmt.Errorf("BANK_DELAY: %q is not a Go duration such as 200ms or 5s", v)
		}
		if d < 0 {
			return Config{}, fmt.Errorf("BANK_DELAY: %v is negative", d)
		}
		c.BankDelay = d
	}
	if v := strings.TrimSpace(getenv("LOG_LEVEL")); v != "" {
		if err := c.LogLevel.UnmarshalText([]byte(v)); err != nil {
			return Config{}, fmt.Errorf("LOG_LEVEL: %q is not one of debug, info, warn, error", v)
		}
	}
	return c, nil
}

// PaymentDeadline is the deadline of POST /payments: the handler's context
// ends this long after the key is claimed, and the claim lapses
// middleware.ClaimMargin later.
const PaymentDeadline = 5 * time.Second

// TransferDeadline is the deadline of POST /transfers: 5 seconds plus
// twice the bank's delay, room for the bank call and a retry of it.
func (c Config) TransferDeadline() time.Duration { return 5*time.Second + 2*c.BankDelay }
