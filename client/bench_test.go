package client

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"testing"

	"github.com/idemkey/idemkey"
)

// BenchmarkRoundTrip measures the transport's own cost per logical request
// over a base that answers at once, without a network.
func BenchmarkRoundTrip(b *testing.B) {
	payload := bytes.Repeat([]byte("x"), 1024)
	ok := rtFunc(func(r *http.Request) (*http.Response, error) {
		if r.Body != nil {
			io.Copy(io.Discard, r.Body)
			r.Body.Close()
		}
		return &http.Response{StatusCode: http.StatusOK, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
	})
	for _, c := range []struct {
		name string
		ctx  context.Context
		body func() io.Reader
	}{
		{"generated key", context.Background(), func() io.Reader { return bytes.NewReader(payload) }},
		{"derived key", WithCallName(idemkey.NewContext(context.Background(), idemkey.Key{Scope: "u", Value: "k"}), "charge"),
			func() io.Reader { return bytes.NewReader(payload) }},
		{"buffered body", context.Background(), func() io.Reader { return opaqueBody{newTracked(string(payload))} }},
	} {
		b.Run(c.name, func(b *testing.B) {
			tr, err := New(WithBase(ok))
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.SetBytes(int64(len(payload)))
			for b.Loop() {
				req, _ := http.NewRequestWithContext(c.ctx, http.MethodPost, "http://127.0.0.1/charges", c.body())
				resp, err := tr.RoundTrip(req)
				if err != nil {
					b.Fatal(err)
				}
				resp.Body.Close()
			}
		})
	}
}
