// Package benchbody is the request body idemkey's benchmarks post: the
// middleware's and the fingerprint's Go benchmarks and the load driver in
// bench/ all measure the same bytes, so their numbers can be read together.
package benchbody

import (
	"strconv"
	"strings"
)

// JSON returns about 1 KiB of JSON: an order with forty small items of two
// members each, the shape of a typical list payload. With sorted false
// every item's members come out of order ("sku" before "qty"), as most
// clients write them, so a canonical form reorders each one; with sorted
// true the same data is already in order.
func JSON(sorted bool) []byte {
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
