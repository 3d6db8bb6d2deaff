package memory

import (
	"errors"
	"fmt"
	"time"

	"github.com/idemkey/idemkey/internal/option"
)

// Defaults of the options.
const (
	// DefaultMaxRecords is the bound on claims and records together when
	// WithMaxRecords is not given.
	DefaultMaxRecords = 100_000
	// DefaultMaxBytes is the bound on the bytes claims and records take
	// together when WithMaxBytes is not given: 256 MiB. It holds the
	// default 100,000 entries while kept responses average under about
	// 2 KiB (body and headers), as most JSON APIs' do, so for those the
	// entry bound is reached first; responses near the middleware's
	// default 1 MiB capture limit stop at about 256 of them. With Go's
	// default GOGC the heap may grow to about twice what is live: plan
	// on some 512 MiB for a store full at its defaults.
	DefaultMaxBytes = 256 << 20
	// DefaultJanitorInterval is how often expired entries are removed when
	// WithJanitorInterval is not given.
	DefaultJanitorInterval = time.Minute
)

// Option configures a Store. New applies options in order (a later option
// overrides an earlier one of the same kind) and returns an error naming
// every invalid value and nil option; no option panics.
type Option func(*config) error

type config struct {
	maxRecords int
	maxBytes   int64
	now        func() time.Time
	interval   time.Duration
	// defaultClock reports that now is time.Now.
	defaultClock bool
}

func newConfig(opts []Option) (config, error) {
	c := config{
		maxRecords:   DefaultMaxRecords,
		maxBytes:     DefaultMaxBytes,
		now:          time.Now,
		interval:     DefaultJanitorInterval,
		defaultClock: true,
	}
	return c, option.Apply("idemkey: memory", &c, opts)
}

// WithMaxRecords bounds how many claims and completed records the store
// holds together. The default is DefaultMaxRecords (100,000).
//
// When the store is full, a claim on a new key first removes expired
// entries (a full pass over the store, made at most once a second of the
// store's clock), then, when that freed nothing, returns an error wrapping
// store.ErrFull, which the middleware answers with 503. Nothing inside its
// life is ever removed to make room: claims on keys the store holds
// (replays, in-flight answers) and Complete, Release and Extend work as
// ever in a full store.
//
// n must be positive.
func WithMaxRecords(n int) Option {
	return func(c *config) error {
		if n <= 0 {
			return fmt.Errorf("WithMaxRecords(%d): the bound must be positive", n)
		}
		c.maxRecords = n
		return nil
	}
}

// WithMaxBytes bounds the bytes that claims and completed records take
// together, as Stats counts them: for each entry a fixed overhead of its
// slot in the store's maps (300 bytes), plus a claim's owner token or a
// record's body, header names and values, token and a few bytes of status
// and times. The default is DefaultMaxBytes (256 MiB).
//
// A claim on a new key that would take the store past n is refused as one
// past WithMaxRecords is: expired entries are removed first (at most one
// pass a second), then the claim gets an error wrapping store.ErrFull, and
// the middleware answers 503. Complete is never refused for its size: its
// handler has already run, and a record dropped then would let a retry run
// it again. So the bound is checked when a key is claimed, and the bytes
// held can pass it by the records of the claims in flight when it was
// reached: at most one response each, up to the middleware's capture limit
// (1 MiB by default). Nothing inside its life is removed to make room.
//
// n must be positive.
func WithMaxBytes(n int64) Option {
	return func(c *config) error {
		if n <= 0 {
			return fmt.Errorf("WithMaxBytes(%d): the bound must be positive", n)
		}
		c.maxBytes = n
		return nil
	}
}

// WithClock sets the clock the store measures claim and retention lives
// against. The default is time.Now. Tests pass a fake clock to move time
// forward without waiting. The clock must be safe for concurrent use;
// readings are compared with time.Time.Sub, so a clock that carries
// monotonic readings (as time.Now does) is immune to wall-clock steps.
//
// now must not be nil.
func WithClock(now func() time.Time) Option {
	return func(c *config) error {
		if now == nil {
			return errors.New("WithClock(nil): the clock must not be nil")
		}
		c.now, c.defaultClock = now, false
		return nil
	}
}

// WithJanitorInterval sets how often the store's background janitor
// removes expired claims and records. The default is
// DefaultJanitorInterval (1 minute). Expiry does not wait for the janitor:
// every access checks the entry it touches against the clock, so the
// interval only bounds how long expired entries keep their memory.
//
// d must be positive.
func WithJanitorInterval(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("WithJanitorInterval(%v): the interval must be positive", d)
		}
		c.interval = d
		return nil
	}
}
