package client

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/idemkey/idemkey"
)

// Replayed reports whether resp is a replay of the kept answer to an earlier
// request with the same key: its Idempotent-Replayed header
// (idemkey.HeaderReplayed, as Stripe sends it too) is "true" (in any case). A nil resp is not a replay.
func Replayed(resp *http.Response) bool {
	return resp != nil && strings.EqualFold(strings.TrimSpace(resp.Header.Get(idemkey.HeaderReplayed)), "true")
}

// Trace reports what the Transport did for one logical request. Pass it with
// WithTrace and read it after the request returns.
type Trace struct {
	// Attempts is how many attempts were sent, the first included.
	Attempts int
	// Key is the idempotency key sent on every attempt, or "" for none.
	Key string
	// Replayed reports whether the final response was a replay (see
	// Replayed).
	Replayed bool
	// Waited is the total time spent waiting between attempts.
	Waited time.Duration
}

type traceContextKey struct{}

// WithTrace returns a copy of ctx that makes the Transport fill in tr for the
// request made with it. RoundTrip overwrites tr when it starts and updates
// it until it returns; read it after that. A Trace belongs to one request at
// a time: sharing one between concurrent requests is a data race. Through an
// http.Client that follows redirects, tr describes the last hop.
func WithTrace(ctx context.Context, tr *Trace) context.Context {
	return context.WithValue(ctx, traceContextKey{}, tr)
}
