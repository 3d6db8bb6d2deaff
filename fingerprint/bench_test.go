package fingerprint

import (
	"crypto/sha256"
	"fmt"
	"math/rand/v2"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/idemkey/idemkey/internal/benchbody"
)

// benchJSON returns a JSON document of about size bytes that looks like an
// API payload: objects whose members are not in order, strings with escapes,
// numbers and nested arrays.
func benchJSON(size int) []byte {
	const suffix = `],"currency":"EUR","amount":12.5}`
	rng := rand.New(rand.NewPCG(1, 2))
	var b strings.Builder
	b.WriteString(`{"order_id":"ord_8f14e45fceea167a","customer":{"name":"J\u00f6rg M\u00fcller","email":"jorg@example.com"},"items":[`)
	for i := 0; ; i++ {
		item := fmt.Sprintf(`{"sku":"SKU-%05d","qty":%d,"price":%d.%02d,"note":"line\n%d \"gift\"","tags":["a","b"]}`,
			rng.IntN(100000), rng.IntN(9)+1, rng.IntN(500), rng.IntN(100), i)
		if i > 0 {
			item = "," + item
		}
		if b.Len()+len(item)+len(suffix) > size {
			break
		}
		b.WriteString(item)
	}
	b.WriteString(suffix)
	s := b.String()
	if len(s) > size {
		// Too small a size for one item: a flat object with a padded string.
		s = `{"b":"` + strings.Repeat("x", max(size-16, 0)) + `","a":1}`
	}
	return []byte(s)
}

var benchSizes = []int{100, 1 << 10, 64 << 10, 1 << 20}

func sizeName(n int) string {
	switch {
	case n >= 1<<20:
		return strconv.Itoa(n>>20) + "MiB"
	case n >= 1<<10:
		return strconv.Itoa(n>>10) + "KiB"
	}
	return strconv.Itoa(n) + "B"
}

var sink [32]byte

// BenchmarkDefaultJSON is the fingerprint the middleware computes for a JSON
// POST: method, path, query, media type and the canonical body.
func BenchmarkDefaultJSON(b *testing.B) {
	for _, n := range benchSizes {
		body := benchJSON(n)
		r := httptest.NewRequest("POST", "/v1/orders?expand=items", nil)
		r.Header.Set("Content-Type", "application/json; charset=utf-8")
		b.Run(sizeName(n), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				sink = Default(r, body)
			}
		})
	}
}

// BenchmarkDefaultRaw is the baseline: the same bodies sent as
// application/octet-stream, hashed as raw bytes.
func BenchmarkDefaultRaw(b *testing.B) {
	for _, n := range benchSizes {
		body := benchJSON(n)
		r := httptest.NewRequest("POST", "/v1/orders?expand=items", nil)
		r.Header.Set("Content-Type", "application/octet-stream")
		b.Run(sizeName(n), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				sink = Default(r, body)
			}
		})
	}
}

// BenchmarkSHA256 is the floor: SHA-256 of the body alone.
func BenchmarkSHA256(b *testing.B) {
	for _, n := range benchSizes {
		body := benchJSON(n)
		b.Run(sizeName(n), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				sink = sha256.Sum256(body)
			}
		})
	}
}

func BenchmarkCanonicalJSON(b *testing.B) {
	for _, n := range benchSizes {
		body := benchJSON(n)
		dst := make([]byte, 0, len(body))
		b.Run(sizeName(n), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				var err error
				if dst, err = CanonicalJSON(dst[:0], body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	// The floor: a SHA-256 of the bytes as they came, which a fingerprint
	// that ignored member order and whitespace could not be cheaper than.
	body := benchbody.JSON(false)
	b.Run("sha256-of-the-bytes", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		for b.Loop() {
			sink = sha256.Sum256(body)
		}
	})
}

func BenchmarkDefaultForm(b *testing.B) {
	body := []byte("name=J%C3%B6rg+M%C3%BCller&email=jorg%40example.com&amount=12.50&currency=EUR&item=SKU-1&item=SKU-2&note=" + strings.Repeat("x", 800))
	r := httptest.NewRequest("POST", "/v1/orders", nil)
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		sink = Default(r, body)
	}
}

// BenchmarkDefaultJSONDeep is a hostile body: objects nested MaxDepth deep,
// every one out of order, around a large payload. Each byte is still copied
// at most twice, so the cost stays close to a flat body's.
func BenchmarkDefaultJSONDeep(b *testing.B) {
	const depth = MaxDepth - 1
	body := []byte(strings.Repeat(`{"b":0,"a":`, depth) + `"` + strings.Repeat("x", 1<<20-13*depth-2) + `"` + strings.Repeat("}", depth))
	if _, err := CanonicalJSON(nil, body); err != nil {
		b.Fatal(err)
	}
	r := httptest.NewRequest("POST", "/v1/orders", nil)
	r.Header.Set("Content-Type", "application/json")
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		sink = Default(r, body)
	}
}

// BenchmarkSmallObjects is the fingerprint and the canonical form of many
// small objects, in order and out of order.
func BenchmarkSmallObjects(b *testing.B) {
	r := httptest.NewRequest("POST", "/payments", nil)
	r.Header.Set("Content-Type", "application/json")
	for _, c := range []struct {
		name   string
		sorted bool
	}{{"unsorted", false}, {"sorted", true}} {
		body := benchbody.JSON(c.sorted)
		b.Run("Default/"+c.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				sink = Default(r, body)
			}
		})
		dst := make([]byte, 0, len(body))
		b.Run("CanonicalJSON/"+c.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				var err error
				if dst, err = CanonicalJSON(dst[:0], body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	// The floor: a SHA-256 of the bytes as they came, which a fingerprint
	// that ignored member order and whitespace could not be cheaper than.
	body := benchbody.JSON(false)
	b.Run("sha256-of-the-bytes", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		for b.Loop() {
			sink = sha256.Sum256(body)
		}
	})
}

// flat200 is a flat object of about 200 bytes, its members out of order:
// the shape of a typical small create request.
var flat200 = []byte(`{"name":"Jane Doe","email":"jane@example.com","amount":1250,"currency":"EUR","description":"Order 12345, two items","country":"DE","reference":"ref-0001","capture":true,"metadata_id":"m-42"}`)

// BenchmarkFlatObject is the fingerprint and the canonical form of a flat
// object of about 200 bytes, beside a SHA-256 of its bytes.
func BenchmarkFlatObject(b *testing.B) {
	r := httptest.NewRequest("POST", "/payments", nil)
	r.Header.Set("Content-Type", "application/json")
	b.Run("Default", func(b *testing.B) {
		b.SetBytes(int64(len(flat200)))
		b.ReportAllocs()
		for b.Loop() {
			sink = Default(r, flat200)
		}
	})
	dst := make([]byte, 0, len(flat200))
	b.Run("CanonicalJSON", func(b *testing.B) {
		b.SetBytes(int64(len(flat200)))
		b.ReportAllocs()
		for b.Loop() {
			var err error
			if dst, err = CanonicalJSON(dst[:0], flat200); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("sha256-of-the-bytes", func(b *testing.B) {
		b.SetBytes(int64(len(flat200)))
		b.ReportAllocs()
		for b.Loop() {
			sink = sha256.Sum256(flat200)
		}
	})
}
