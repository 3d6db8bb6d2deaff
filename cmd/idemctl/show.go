package main

import (
	"context"
	"encoding/hex"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkey/idemkey/store"
)

// entry is what show prints about a key, and delete before it asks.
type entry struct {
	Key    string `json:"key"`
	Digest string `json:"digest"`
	Found  bool   `json:"found"`
	// State is "in_flight" or "completed"; "unreadable" for a value this
	// version cannot decode.
	State       string     `json:"state,omitempty"`
	Fingerprint string     `json:"fingerprint,omitempty"`
	CreatedAt   *time.Time `json:"created_at,omitempty"`
	// AgeSeconds is the time since the key was claimed.
	AgeSeconds float64 `json:"age_seconds,omitempty"`
	// TTLSeconds is the key's remaining life; -1 when it never expires.
	TTLSeconds  float64             `json:"ttl_seconds,omitempty"`
	Status      int                 `json:"status,omitempty"`
	CompletedAt *time.Time          `json:"completed_at,omitempty"`
	BodyBytes   *int                `json:"body_bytes,omitempty"`
	BodyOmitted bool                `json:"body_omitted,omitempty"`
	Headers     map[string][]string `json:"headers,omitempty"`
	Body        *string             `json:"body,omitempty"`
	// ValueBytes is the length of the stored value; MemoryBytes what
	// MEMORY USAGE reports for the key (0 when the server does not say).
	ValueBytes  int    `json:"value_bytes,omitempty"`
	MemoryBytes int64  `json:"memory_bytes,omitempty"`
	Error       string `json:"error,omitempty"`
	// PostgreSQL only. Expired: the row's life is over and the sweeper
	// has not deleted it yet (the store treats the key as free; TTLSeconds
	// is how long ago it expired, negative). Transactional: a claim made
	// in a request's transaction; OwnerGone: its owner's session is gone,
	// and the next request takes the key over.
	Expired       bool `json:"expired,omitempty"`
	Transactional bool `json:"transactional,omitempty"`
	OwnerGone     bool `json:"owner_gone,omitempty"`
	// Elsewhere, for a Redis key not found, lists keys that hold the same
	// digest behind another key prefix (redis.WithKeyPrefix): the service's
	// store has a prefix that --redis-prefix did not give.
	Elsewhere []string `json:"found_under_other_prefix,omitempty"`

	seen store.Entry // what Inspect read, for delete's compare-and-delete
}

// fetch reads what key holds from the store e names.
func (e *env) fetch(ctx context.Context, key string, withBody bool) (*entry, error) {
	// The key as the store names it: behind the Redis prefix, if any.
	ent := &entry{Key: e.prefix + key, Digest: store.DigestOf(key)}
	se, ok, err := e.st.Inspect(ctx, key)
	if !ok {
		return ent, err
	}
	ent.Found, ent.seen, ent.ValueBytes, ent.MemoryBytes = true, se, se.Size, se.Memory
	if se.NoExpiry {
		ent.TTLSeconds = -1
	} else {
		ent.TTLSeconds = se.TTL.Seconds()
	}
	ent.Expired, ent.Transactional, ent.OwnerGone = se.Expired, se.Transactional, se.OwnerGone
	if se.Fingerprint != ([32]byte{}) {
		ent.Fingerprint = hex.EncodeToString(se.Fingerprint[:])
	}
	if !se.CreatedAt.IsZero() {
		t := se.CreatedAt
		ent.CreatedAt = &t
		ent.AgeSeconds = time.Since(t).Seconds()
	}
	if err != nil {
		ent.State, ent.Error = "unreadable", err.Error()
		return ent, nil
	}
	switch se.State {
	case store.InFlight:
		ent.State = "in_flight"
	case store.Completed:
		ent.State = "completed"
		rec := se.Record
		ent.Status = rec.Status
		if !rec.CompletedAt.IsZero() {
			t := rec.CompletedAt
			ent.CompletedAt = &t
		}
		n := len(rec.Body)
		ent.BodyBytes, ent.BodyOmitted, ent.Headers = &n, rec.BodyOmitted, rec.Header
		if withBody {
			b := string(rec.Body)
			ent.Body = &b
		}
	}
	return ent, nil
}

func show(ctx context.Context, e *env, args []string) error {
	fs := commandFlags(e, "show", "--scope S --key K | --digest HEX [--body]")
	keyOf := keyFlags(fs)
	body := fs.Bool("body", false, "print the kept response body as well")
	ctx, err := parseFlags(ctx, e, fs, args)
	if err != nil {
		return err
	}
	key, err := keyOf()
	if err != nil {
		return err
	}
	ent, err := e.fetch(ctx, key, *body)
	if err != nil {
		return err
	}
	if !ent.Found && e.rdb != nil {
		// A service whose store has redis.WithKeyPrefix keeps the key behind
		// its prefix: say where, rather than only that it is not here.
		if ent.Elsewhere, err = findPrefixed(ctx, e.rdb, e.prefix+key, key); err != nil {
			return err
		}
	}
	if e.json {
		if err := e.printJSON(ent); err != nil {
			return err
		}
	} else {
		e.printEntry(ent)
	}
	if !ent.Found {
		return errNotDone
	}
	return nil
}

// printEntry writes an entry as aligned text.
func (e *env) printEntry(ent *entry) {
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	defer tw.Flush()
	row := func(name, format string, a ...any) { fmt.Fprintf(tw, "%s\t"+format+"\n", append([]any{name}, a...)...) }
	row("key", "%s", ent.Key)
	row("digest", "%s", ent.Digest)
	if !ent.Found {
		row("state", "not found (never used, expired, or deleted)")
		for _, k := range ent.Elsewhere {
			row("found as", "%s: pass --redis-prefix %q (the prefix the service gives redis.WithKeyPrefix)", k, strings.TrimSuffix(k, ent.Key[len(e.prefix):]))
		}
		return
	}
	row("state", "%s", strings.ReplaceAll(ent.State, "_", " "))
	if ent.Error != "" {
		row("error", "%s", ent.Error)
	}
	if ent.Fingerprint != "" {
		row("fingerprint", "%s", ent.Fingerprint)
	}
	if ent.CreatedAt != nil {
		row("created", "%s (%s ago)", ent.CreatedAt.UTC().Format(time.RFC3339Nano), roundDuration(ent.AgeSeconds))
	}
	if ent.CompletedAt != nil {
		row("completed", "%s", ent.CompletedAt.UTC().Format(time.RFC3339Nano))
	}
	switch {
	case ent.Expired:
		row("ttl", "expired %s ago (the store treats the key as free; the sweeper deletes the row)", roundDuration(-ent.TTLSeconds))
	case ent.Transactional && ent.TTLSeconds == 0:
		row("ttl", "unknown (the claim is held by its request's transaction and not committed)")
	case ent.TTLSeconds < 0:
		row("ttl", "none (the key never expires: it was not written by idemkey)")
	default:
		row("ttl", "%s", roundDuration(ent.TTLSeconds))
	}
	if ent.Transactional && ent.State == "in_flight" {
		if ent.OwnerGone {
			row("owner", "gone (claimed by an earlier version, whose database session ended: the key is free when the claim's life ends)")
		} else {
			row("owner", "alive (its transaction holds the key's lock)")
		}
	}
	if ent.State == "completed" {
		row("status", "%d %s", ent.Status, http.StatusText(ent.Status))
		omitted := ""
		if ent.BodyOmitted {
			omitted = " (omitted: the response was larger than the capture limit)"
		}
		row("body", "%d bytes%s", *ent.BodyBytes, omitted)
		names := make([]string, 0, len(ent.Headers))
		for k := range ent.Headers {
			names = append(names, k)
		}
		slices.Sort(names)
		for _, k := range names {
			for _, v := range ent.Headers[k] {
				row("header", "%s: %s", k, v)
			}
		}
	}
	mem := ""
	if ent.MemoryBytes > 0 {
		mem = fmt.Sprintf(", %d bytes in memory", ent.MemoryBytes)
	}
	if e.table != "" {
		if ent.ValueBytes > 0 {
			row("row", "%d bytes (in the table, without its index entries)", ent.ValueBytes)
		}
	} else {
		row("value", "%d bytes%s", ent.ValueBytes, mem)
	}
	if ent.Body != nil {
		tw.Flush()
		fmt.Fprintf(e.stdout, "\n%s\n", *ent.Body)
	}
}

// roundDuration prints seconds as a duration rounded for reading.
func roundDuration(s float64) string {
	d := time.Duration(s * float64(time.Second))
	switch {
	case d >= time.Hour:
		return d.Round(time.Second).String()
	case d >= time.Second:
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Microsecond).String()
}

// maxElsewhere bounds the keys findPrefixed reports.
const maxElsewhere = 5

// findPrefixed returns up to maxElsewhere keys that end in key (the store
// key without a prefix) but are not shown: the same record behind another
// redis.WithKeyPrefix. It scans every master (SCAN MATCH *<key>), within
// the command's timeout.
func findPrefixed(ctx context.Context, rdb goredis.UniversalClient, shown, key string) ([]string, error) {
	var mu sync.Mutex
	var found []string
	scan := func(ctx context.Context, c goredis.UniversalClient) error {
		iter := c.Scan(ctx, 0, "*"+globEscape(key), 1000).Iterator()
		for iter.Next(ctx) {
			k := iter.Val()
			mu.Lock()
			if k != shown && len(found) < maxElsewhere {
				found = append(found, k)
			}
			full := len(found) >= maxElsewhere
			mu.Unlock()
			if full {
				break
			}
		}
		if err := iter.Err(); err != nil {
			return fmt.Errorf("looking for the key under another prefix: %w", err)
		}
		return nil
	}
	var err error
	if cc, ok := rdb.(*goredis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error { return scan(ctx, c) })
	} else {
		err = scan(ctx, rdb)
	}
	slices.Sort(found)
	return found, err
}

// globEscape escapes the characters SCAN's MATCH pattern gives a meaning.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
