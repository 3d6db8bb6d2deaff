package postgres

import (
	"hash/fnv"
	"testing"
)

// TestLocksAreFNV: the lock ids are FNV-1a of the table, a 0 byte and the
// key (then the fingerprint), computed without allocating. They must not
// change between versions: instances of two versions running at once
// must take the same locks for a key.
func TestLocksAreFNV(t *testing.T) {
	s := &Store{table: `"app"."idem"`}
	fp := [32]byte{1, 2, 3}
	h := fnv.New64a()
	h.Write([]byte(s.table))
	h.Write([]byte{0})
	h.Write([]byte("idem:v1:{k}"))
	want1 := int64(h.Sum64())
	h.Write(fp[:])
	want2 := int64(h.Sum64())
	if l1, l2 := s.locks("idem:v1:{k}", fp); l1 != want1 || l2 != want2 {
		t.Fatalf("locks %d %d, want %d %d", l1, l2, want1, want2)
	}
	if n := testing.AllocsPerRun(100, func() { s.locks("idem:v1:{k}", fp) }); n != 0 {
		t.Fatalf("%v allocations", n)
	}
}
