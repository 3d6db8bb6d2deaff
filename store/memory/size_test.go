package memory

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/http"
	"runtime"
	"testing"
	"time"

	"github.com/idemkey/idemkey/store"
)

// heapInUse is the heap in use after a collection.
func heapInUse() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// TestEntryOverheadCoversWhatASlotTakes: the bytes the store counts for an
// entry beside its token or record (entryOverhead) are at least what its
// slot in the maps takes on the heap. It measures with runtime.MemStats how
// the heap grows while one store fills with claims (owner tokens of
// rand.Text, as the middleware makes them) or with small kept records, at
// several fills of the maps' tables (every 4,000 entries, through two
// doublings), less what the store counts for the tokens and records
// themselves. The store used to count 200 bytes an entry; a slot takes
// 170 to 276 (Go 1.26, amd64).
func TestEntryOverheadCoversWhatASlotTakes(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates tens of megabytes")
	}
	const most = 128_000
	ctx := context.Background()
	for _, complete := range []bool{false, true} {
		s, err := New(WithMaxRecords(most), WithMaxBytes(1<<40), WithJanitorInterval(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		// Every store stays alive to the end, so that none is collected
		// while another is measured.
		defer s.Close()
		base := heapInUse()
		var own int64 // what the store counts for the tokens or records
		i := 0
		for n := 4000; n <= most; n += 4000 {
			for ; i < n; i++ {
				tok := rand.Text()
				name := store.KeyName("s", fmt.Sprint(i)) // garbage once claimed
				if _, err := s.Claim(ctx, name, store.Claim{Token: tok, TTL: time.Hour}); err != nil {
					t.Fatal(err)
				}
				if complete {
					rec := &store.Record{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"pay_1","amount":10,"currency":"EUR"}`)}
					if err := s.Complete(ctx, name, tok, rec, time.Hour); err != nil {
						t.Fatal(err)
					}
				}
			}
			st := statsOf(s)
			own = st.Bytes - int64(n)*entryOverhead
			slot := float64(heapInUse()-base-own) / float64(n)
			t.Logf("records %v, %d entries: %.0f bytes a slot", complete, n, slot)
			if slot > entryOverhead {
				t.Errorf("records %v, %d entries: the store counts %d bytes an entry beside its token or record, a slot takes %.0f", complete, n, entryOverhead, slot)
			}
		}
	}
}
