package middleware

import (
	"net/http"
	"reflect"
	"strconv"
	"testing"

	"github.com/idemkey/idemkey"
	"github.com/idemkey/idemkey/internal/neverkept"
)

// keptHeader keeps what keep accepts and the Connection header does not
// name, with values copied, for a few headers and for more than it notes
// on the stack.
func TestKeptHeader(t *testing.T) {
	for _, n := range []int{0, 1, 7, 8, 9, 20} {
		h := http.Header{"Connection": {"X-Hop-1, x-hop-2"}, "X-Hop-1": {"a"}, "X-Hop-2": {"b"}, "Date": {"today"}}
		want := http.Header{}
		for i := range n {
			k := "X-Kept-" + strconv.Itoa(i)
			h[k] = []string{"v" + strconv.Itoa(i), "w"}
			want[k] = []string{"v" + strconv.Itoa(i), "w"}
		}
		got := keptHeader(h, func(k string) bool { return k != "Connection" && DefaultKeepHeader(k) }, nil)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%d headers: kept %v, want %v", n, got, want)
		}
		for _, v := range h {
			v[0] = "changed"
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%d headers: a change to the response's headers reached the kept ones: %v", n, got)
		}
	}
}

// headerValue reads the map directly, which Header.Get does only for names
// already canonical: the names it is given must be.
func TestHeaderValueNamesAreCanonical(t *testing.T) {
	for _, name := range []string{idemkey.HeaderRequestID, "Content-Length", "Transfer-Encoding"} {
		if c := http.CanonicalHeaderKey(name); c != name {
			t.Errorf("%q is not canonical (%q)", name, c)
		}
		h := http.Header{}
		h.Add(name, "v")
		if headerValue(h, name) != h.Get(name) || headerValue(http.Header{}, name) != "" {
			t.Errorf("headerValue(%q) differs from Header.Get", name)
		}
	}
}

// Every per-call and trace header DefaultKeepHeader's doc names is
// refused, the single-header B3 form (b3) among them, and so is every
// header of package neverkept, which idemgrpc's DefaultKeepMetadata
// refuses as metadata; headers that merely resemble one are kept.
func TestDefaultKeepHeaderRefusesTraceHeaders(t *testing.T) {
	refused := []string{"date", "set-cookie", "x-request-id", "server-timing",
		"traceparent", "tracestate", "traceresponse", "baggage", "b3", "x-b3-traceid", "x-b3-sampled", "uber-trace-id",
		"x-amzn-trace-id", "x-cloud-trace-context", "grpc-trace-bin", "sentry-trace"}
	refused = append(refused, neverkept.Names()...)
	for _, p := range neverkept.Prefixes() {
		refused = append(refused, p+"anything")
	}
	for _, name := range refused {
		if DefaultKeepHeader(http.CanonicalHeaderKey(name)) {
			t.Errorf("%s is kept", name)
		}
	}
	for _, name := range []string{"Content-Type", "Location", "Etag", "B3-Custom", "Sentry-Release", "Grpc-Trace"} {
		if !DefaultKeepHeader(name) {
			t.Errorf("%s is refused", name)
		}
	}
}
