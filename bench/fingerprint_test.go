// Package bench holds benchmarks that explain the load driver's numbers;
// the driver itself is cmd/load.
package bench

import (
	"crypto/sha256"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/idemkey/idemkey/fingerprint"
)

// payload builds the load driver's request body: about 1 KiB of JSON,
// forty small objects. With sorted false their members are written
// "sku","qty" (not in sorted order, as most clients write them), so the
// canonical form reorders every object; with sorted true the same data
// comes already in order.
func payload(sorted bool) []byte {
	var b strings.Builder
	b.WriteString(`{"amount":1000,"currency":"EUR","items":[`)
	for i := 0; b.Len() < 1000; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		if sorted {
			b.WriteString(`{"qty":2,"sku":"item-` + strconv.Itoa(i) + `"}`)
		} else {
			b.WriteString(`{"sku":"item-` + strconv.Itoa(i) + `","qty":2}`)
		}
	}
	b.WriteString(`]}`)
	return []byte(b.String())
}

// The fingerprint is the largest single cost of the middleware on the
// driver's request: these show how much of it is reordering members.
func BenchmarkFingerprint(b *testing.B) {
	r := &http.Request{Method: http.MethodPost, URL: &url.URL{Path: "/payments"},
		Header: http.Header{"Content-Type": {"application/json"}}}
	for _, c := range []struct {
		name   string
		sorted bool
	}{{"members-unsorted", false}, {"members-sorted", true}} {
		body := payload(c.sorted)
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				fingerprint.Default(r, body)
			}
		})
	}
	body := payload(false)
	b.Run("sha256-of-the-bytes", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			sha256.Sum256(body)
		}
	})
}
