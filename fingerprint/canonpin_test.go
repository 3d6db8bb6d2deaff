package fingerprint

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
)

// The canonical forms are pinned: a canonical form that changes changes the
// fingerprint of every stored request whose body has it, and that
// request's retry would be answered 422 instead of replayed. The
// seeds and 20,000 generated documents (genJSON, from a fixed seed) are
// canonicalised, and each run of 1,000 is hashed, canonical forms and
// error texts (so the offsets) alike; the digests are pinned in
// testdata/canonical-forms.golden, written from the canonicaliser as it
// stood before its speed was tuned (2fe902f) and checked against it.
//
// A change meant to leave every output as it is passes here unchanged. To
// check such a change against the code before it more widely, copy that
// code into a package of its own and compare the two on many more
// generated documents and under the fuzzer, as was done for the tuning:
//
//	mkdir -p fingerprint/internal/oldcanon
//	for f in json.go jsonname.go jsonstring.go; do
//	  git show 2fe902f:fingerprint/$f | sed 's/^package fingerprint/package oldcanon/' > fingerprint/internal/oldcanon/$f
//	done
//
// then compare CanonicalJSON with oldcanon.CanonicalJSON on genJSON's
// documents and every fuzz corpus entry (output, error text, and which
// error). A change to the canonical form itself is a change of the
// contract (SPEC step 6): rewrite the file with -canon.update, and say why.
var updateCanon = flag.Bool("canon.update", false, "rewrite testdata/canonical-forms.golden from the canonicaliser as it is")

const (
	pinnedDocs  = 20000
	pinnedChunk = 1000
	pinnedFile  = "testdata/canonical-forms.golden"
)

// canonDigests canonicalises the seeds and the generated documents with
// canon and returns the digest of each run of pinnedChunk of them.
func canonDigests(canon func(dst, src []byte) ([]byte, error)) []string {
	var docs [][]byte
	for _, s := range jsonSeeds {
		docs = append(docs, []byte(s))
	}
	rng := rand.New(rand.NewPCG(20261203, 1))
	for range pinnedDocs {
		docs = append(docs, genJSON(rng))
	}
	var out []string
	for i := 0; i < len(docs); i += pinnedChunk {
		h := sha256.New()
		for _, d := range docs[i:min(i+pinnedChunk, len(docs))] {
			form, err := canon(nil, d)
			if err != nil {
				fmt.Fprintf(h, "error %d %s\n", len(err.Error()), err)
			} else {
				fmt.Fprintf(h, "form %d %s\n", len(form), form)
			}
		}
		out = append(out, fmt.Sprintf("%d-%d %s", i, min(i+pinnedChunk, len(docs))-1, hex.EncodeToString(h.Sum(nil))))
	}
	return out
}

func readPinned(t *testing.T) []string {
	t.Helper()
	f, err := os.Open(pinnedFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" && !strings.HasPrefix(l, "#") {
			lines = append(lines, l)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return lines
}

func TestCanonicalFormsPinned(t *testing.T) {
	got := canonDigests(CanonicalJSON)
	if *updateCanon {
		body := "# Digests of the canonical forms of fingerprint's seeds and of genJSON's\n# documents: see TestCanonicalFormsPinned.\n" + strings.Join(got, "\n") + "\n"
		if err := os.WriteFile(pinnedFile, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want := readPinned(t)
	if len(got) != len(want) {
		t.Fatalf("%d runs of documents, %d pinned", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("the canonical forms of documents %s changed (pinned %s)", got[i], want[i])
		}
	}
}
