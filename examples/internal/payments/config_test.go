package payments

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"
)

func env(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }

func TestParseEnvDefaults(t *testing.T) {
	c, err := ParseEnv(env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.Addr != "127.0.0.1:8080" {
		t.Errorf("Addr %q, want 127.0.0.1:8080", c.Addr)
	}
	if c.BankDelay != 200*time.Millisecond {
		t.Errorf("BankDelay %v, want 200ms", c.BankDelay)
	}
	if c.RedisURL != "" || c.RedisClusterAddrs != nil || c.DatabaseURL != "" {
		t.Errorf("Redis %q %q, database %q, want none (the in-memory store)", c.RedisURL, c.RedisClusterAddrs, c.DatabaseURL)
	}
	if c.PaymentDelay != 0 {
		t.Errorf("PaymentDelay %v, want 0", c.PaymentDelay)
	}
	if c.LogLevel != slog.LevelInfo {
		t.Errorf("LogLevel %v, want info", c.LogLevel)
	}
	if got, want := c.TransferDeadline(), 5*time.Second+400*time.Millisecond; got != want {
		t.Errorf("TransferDeadline %v, want %v", got, want)
	}
}

func TestParseEnvValues(t *testing.T) {
	c, err := ParseEnv(env(map[string]string{
		"ADDR":                " 127.0.0.1:9000 ",
		"REDIS_CLUSTER_ADDRS": "10.0.0.1:7000, 10.0.0.2:7000,,",
		"BANK_DELAY":          "3s",
		"LOG_LEVEL":           "debug",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Addr != "127.0.0.1:9000" || c.BankDelay != 3*time.Second || c.LogLevel != slog.LevelDebug {
		t.Errorf("%+v", c)
	}
	if want := []string{"10.0.0.1:7000", "10.0.0.2:7000"}; !slices.Equal(c.RedisClusterAddrs, want) {
		t.Errorf("RedisClusterAddrs %q, want %q", c.RedisClusterAddrs, want)
	}
	c, err = ParseEnv(env(map[string]string{"REDIS_URL": "redis://127.0.0.1:6379/2", "BANK_DELAY": "0"}))
	if err != nil {
		t.Fatal(err)
	}
	if c.RedisURL != "redis://127.0.0.1:6379/2" || c.BankDelay != 0 {
		t.Errorf("%+v", c)
	}
	c, err = ParseEnv(env(map[string]string{"DATABASE_URL": " postgres://postgres@127.0.0.1:5432/test ", "PAYMENT_DELAY": "3s"}))
	if err != nil {
		t.Fatal(err)
	}
	if c.DatabaseURL != "postgres://postgres@127.0.0.1:5432/test" || c.PaymentDelay != 3*time.Second {
		t.Errorf("%+v", c)
	}
}

func TestParseEnvErrors(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"BANK_DELAY": "200"}, "BANK_DELAY"},
		{map[string]string{"BANK_DELAY": "-1s"}, "BANK_DELAY"},
		{map[string]string{"LOG_LEVEL": "loud"}, "LOG_LEVEL"},
		{map[string]string{"REDIS_URL": "redis://a:6379", "REDIS_CLUSTER_ADDRS": "b:6379"}, "not both"},
		{map[string]string{"REDIS_URL": "redis://a:6379", "DATABASE_URL": "postgres://b/db"}, "DATABASE_URL or REDIS_URL"},
		{map[string]string{"REDIS_CLUSTER_ADDRS": "a:6379", "DATABASE_URL": "postgres://b/db"}, "DATABASE_URL or REDIS_URL"},
		{map[string]string{"PAYMENT_DELAY": "3"}, "PAYMENT_DELAY"},
		{map[string]string{"PAYMENT_DELAY": "-1s"}, "PAYMENT_DELAY"},
	} {
		_, err := ParseEnv(env(tc.env))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want one that mentions %q", tc.env, err, tc.want)
		}
	}
}

func TestBearer(t *testing.T) {
	for _, tc := range []struct {
		h    []string
		user string
		ok   bool
	}{
		{[]string{"Bearer alice"}, "alice", true},
		{[]string{"bearer  bob.smith_1~"}, "bob.smith_1~", true},
		{[]string{"Bearer " + strings.Repeat("a", 64)}, strings.Repeat("a", 64), true},
		{[]string{"Bearer " + strings.Repeat("a", 65)}, "", false},
		{[]string{"Bearer"}, "", false},
		{[]string{"Bearer "}, "", false},
		{[]string{"Bearer anonymous"}, "", false},
		{[]string{"Bearer al ice"}, "", false},
		{[]string{"Bearer alicé"}, "", false},
		{[]string{"Basic YWxpY2U6"}, "", false},
		{[]string{"Bearer alice", "Bearer bob"}, "", false},
	} {
		user, ok := bearer(tc.h)
		if user != tc.user || ok != tc.ok {
			t.Errorf("bearer(%q) = %q, %v; want %q, %v", tc.h, user, ok, tc.user, tc.ok)
		}
	}
}

// go-redis's own lines reach the service's structured log as warnings.
func TestRedisLogIsStructured(t *testing.T) {
	var buf bytes.Buffer
	l := slog.New(slog.NewJSONHandler(&buf, nil))
	redisLog{l.With("component", "go-redis")}.Printf(context.Background(), "redis: %s failed to dial: %v", "127.0.0.1:6399", "connection refused")
	var rec map[string]any
	if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
		t.Fatalf("not one JSON record: %q", buf.String())
	}
	if rec["level"] != "WARN" || rec["component"] != "go-redis" || rec["msg"] != "redis: 127.0.0.1:6399 failed to dial: connection refused" {
		t.Fatalf("record %v", rec)
	}
}
