package fingerprint

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
)

// MaxDepth is the deepest nesting of arrays and objects CanonicalJSON
// accepts: a document whose containers nest more than 1000 levels deep is
// rejected with ErrTooDeep, and its fingerprint covers its raw bytes. The
// bound keeps a hostile body from driving the reader's recursion deep; the
// work stays linear in the size of the body at any depth.
const MaxDepth = 1000

// Errors CanonicalJSON wraps. Match them with errors.Is.
var (
	// ErrInvalidJSON: the input is not a JSON text (RFC 8259).
	ErrInvalidJSON = errors.New("idemkey: fingerprint: invalid JSON")
	// ErrTooDeep: the input nests arrays and objects deeper than MaxDepth.
	ErrTooDeep = errors.New("idemkey: fingerprint: JSON nested too deep")
)

// CanonicalJSON appends the canonical form of the JSON text src to dst and
// returns the extended buffer. The canonical form is itself a JSON text
// (encoding/json accepts it) and canonicalising it again changes nothing.
//
// Two texts have the same canonical form exactly when they differ only in
// what a JSON reader cannot observe:
//
//   - Insignificant whitespace is dropped.
//   - Strings are decoded and written back one way: a character is written
//     as itself except '"' and '\' (written \" and \\) and the control
//     characters below U+0020 (written \b, \f, \n, \r, \t, or \u00XX with
//     lower-case hex). So "\u0041", "A" and "\/" and "/" are the same.
//     A surrogate pair escape becomes the character it encodes. A lone
//     surrogate escape stays an escape (\udXXX, lower-case) and bytes that
//     are not UTF-8 stay as they are: both remain distinct from every other
//     string, U+FFFD included.
//   - Numbers keep their literal text: 1, 1.0, 1e0 and 1E0 are four
//     different numbers, because a reader can tell them apart.
//   - Object members are ordered by name. Names are compared after folding
//     them the way a case-insensitive decoder matches names: decoded,
//     invalid UTF-8 and lone surrogates read as U+FFFD, letters case-folded
//     (encoding/json matches struct fields ignoring case), '_' and '-'
//     dropped (as encoding/json/v2 does when it matches names that way).
//     Members whose names fold to the same value (exact duplicates, but
//     also "id" and "ID") keep their relative order and are never merged,
//     because a decoder that lets the last of them win would see different
//     values. So {"a":1,"a":2} and {"a":2,"a":1} stay different.
//   - Array elements keep their order.
//
// On error dst is returned as it was, with an error that wraps
// ErrInvalidJSON or ErrTooDeep and names the byte offset in src where
// reading stopped.
func CanonicalJSON(dst, src []byte) ([]byte, error) {
	s := getScratch()
	defer putScratch(s)
	c := &s.json
	out, err := c.canonicalise(src)
	if err != nil {
		off := c.pos
		return dst, fmt.Errorf("%w at byte offset %d", err, off)
	}
	if c.reorder {
		dst = c.emit(dst, 0, len(out), 0)
	} else {
		dst = append(dst, out...)
	}
	return dst, nil
}

// canonJSON is the state of one canonicalisation. Its buffers are reused
// from call to call through the scratch pool.
//
// The first pass validates src and writes its canonical form with object
// members still in their original order into out. Bytes that the canonical
// form keeps as they are are not copied one token at a time: out is
// followed by the pending run src[run:pos], which is copied (flush) only
// where the canonical form departs from the input (whitespace, an escape
// written another way) or where out is needed whole (an object rewritten,
// the second pass). A text already canonical is never copied at all. Spans
// "in out" are positions in the canonical form: out and the pending run.
//
// For every object the first pass records the members' spans in out and
// their folded names; an object whose members are already in order needs
// nothing more. A small object with no object inside it that is out of
// order has its members rewritten in sorted order where they stand, as
// soon as it closes. If any other object is out of order, a second pass
// (emit) copies out into the final buffer, writing the members of those
// objects in sorted order. Each byte is copied at most four times whatever
// the nesting (once by the first pass, twice when its innermost object is
// rewritten, once by emit), so the work stays linear in the input.
type canonJSON struct {
	src   []byte
	pos   int
	depth int
	out   []byte
	run   int // start in src of the bytes after out that are canonical as they are
	// mem holds the members of the objects being read, innermost last; fold
	// holds their folded names.
	mem  []member
	fold []byte
	// objs lists, in the order they were opened, the objects emit must
	// visit: those that need reordering and those that hold one; sorted
	// holds the members of the ones that need reordering, in their
	// canonical order. An object in order with none of objs inside it is
	// not kept.
	objs    []object
	sorted  []member
	reorder bool
	// opened counts the objects opened so far; tmp holds a small object
	// while its members are rewritten in order.
	opened int
	tmp    []byte
	// h, when set, receives what emit writes in chunks, so that the
	// canonical form is hashed without being held whole.
	h io.Writer
}

// member is one name/value pair of an object.
type member struct {
	start, end         int    // `"name":value` in out
	foldStart, foldEnd int    // the folded name in fold
	obj                int    // index in objs of the first object kept after the member's start
	key                uint64 // the folded name's first eight bytes, big-endian, zero-padded
}

// foldKey returns the first eight bytes of f as a big-endian number, padded
// with zeros.
func foldKey(f []byte) uint64 {
	if len(f) >= 8 {
		return binary.BigEndian.Uint64(f)
	}
	var k uint64
	for i, b := range f {
		k |= uint64(b) << (56 - 8*i)
	}
	return k
}

// compareMembers compares the folded names of a and b as bytes.Compare
// does.
func (c *canonJSON) compareMembers(a, b *member) int {
	if a.key != b.key {
		if a.key < b.key {
			return -1
		}
		return 1
	}
	la, lb := a.foldEnd-a.foldStart, b.foldEnd-b.foldStart
	if la <= 8 || lb <= 8 {
		// The first eight bytes are equal, so the shorter name is a prefix
		// of the longer (a name's zero bytes pad like the key's).
		return la - lb
	}
	return bytes.Compare(c.fold[a.foldStart+8:a.foldEnd], c.fold[b.foldStart+8:b.foldEnd])
}

// object is one object of the document.
type object struct {
	start, end  int // from '{' to '}' inclusive, in out
	first, last int // its members in sorted; first < 0 when already in order
	next        int // index in objs of the first object after this one's contents
}

func (c *canonJSON) reset(src []byte) {
	c.src = src
	c.pos = 0
	c.depth = 0
	if cap(c.out) < len(src) {
		// The canonical form is never longer than the input.
		c.out = make([]byte, 0, len(src))
	}
	c.out = c.out[:0]
	c.run = 0
	c.mem = c.mem[:0]
	c.fold = c.fold[:0]
	c.objs = c.objs[:0]
	c.sorted = c.sorted[:0]
	c.reorder = false
	c.opened = 0
}

// canonicalise runs the first pass. The returned slice is canonical except
// for the order of members in objects that need reordering (c.reorder),
// and is c.out then. Otherwise it may be src itself, when src is canonical
// as it is: it must not be written to.
func (c *canonJSON) canonicalise(src []byte) ([]byte, error) {
	c.reset(src)
	c.skipSpace()
	if err := c.value(); err != nil {
		return nil, err
	}
	c.skipSpace()
	if c.pos != len(c.src) {
		return nil, ErrInvalidJSON
	}
	if len(c.out) == 0 && c.run == 0 && !c.reorder {
		c.src = nil
		return src, nil
	}
	c.flush()
	c.src = nil
	return c.out, nil
}

// outLen is the length of the canonical form so far: out, and the pending
// run after it.
func (c *canonJSON) outLen() int { return len(c.out) + c.pos - c.run }

// flush copies the pending run to out.
func (c *canonJSON) flush() {
	c.out = append(c.out, c.src[c.run:c.pos]...)
	c.run = c.pos
}

// emit appends out[start:end] to dst, writing the members of every object
// that needs reordering in their sorted order. i is the index in objs of the
// first object that starts at or after start. When c.h is set, what dst
// holds goes to c.h whenever it passes emitChunk bytes.
func (c *canonJSON) emit(dst []byte, start, end, i int) []byte {
	pos := start
	for i < len(c.objs) && c.objs[i].start < end {
		o := &c.objs[i]
		if o.first < 0 {
			// In order already; objects inside it may not be.
			i++
			continue
		}
		dst = c.put(dst, c.out[pos:o.start])
		dst = append(dst, '{')
		for k, m := range c.sorted[o.first:o.last] {
			if k > 0 {
				dst = append(dst, ',')
			}
			dst = c.emit(dst, m.start, m.end, m.obj)
		}
		dst = append(dst, '}')
		pos = o.end
		i = o.next
	}
	return c.put(dst, c.out[pos:end])
}

// emitChunk is how much emit holds before it writes to c.h.
const emitChunk = 8 << 10

// put appends p to dst, or when c.h is set and dst would pass emitChunk,
// writes dst (and a long p) to c.h instead.
func (c *canonJSON) put(dst, p []byte) []byte {
	if c.h == nil || len(dst)+len(p) <= emitChunk {
		return append(dst, p...)
	}
	c.h.Write(dst)
	dst = dst[:0]
	if len(p) >= emitChunk {
		c.h.Write(p)
		return dst
	}
	return append(dst, p...)
}

func (c *canonJSON) skipSpace() {
	// Most JSON has no space between tokens: one test finds none.
	if c.pos >= len(c.src) || c.src[c.pos] > ' ' {
		return
	}
	c.skipSpaceSlow()
}

// skipSpaceSlow drops the whitespace at c.pos from the canonical form.
func (c *canonJSON) skipSpaceSlow() {
	c.flush()
	for c.pos < len(c.src) {
		switch c.src[c.pos] {
		case ' ', '\t', '\n', '\r':
			c.pos++
		default:
			c.run = c.pos
			return
		}
	}
	c.run = c.pos
}

func (c *canonJSON) value() error {
	if c.pos >= len(c.src) {
		return ErrInvalidJSON
	}
	switch c.src[c.pos] {
	case '{':
		return c.object()
	case '[':
		return c.array()
	case '"':
		return c.str()
	case 't':
		return c.literal("true")
	case 'f':
		return c.literal("false")
	case 'n':
		return c.literal("null")
	default:
		return c.number()
	}
}

// memberValue is value after optional whitespace, with the commonest
// members of arrays and objects, strings, numbers and objects, read without
// going through value. Whitespace is looked for only when none of these
// starts at c.pos: most JSON has none between tokens.
func (c *canonJSON) memberValue() error {
	if c.pos < len(c.src) {
		switch b := c.src[c.pos]; {
		case b == '"':
			return c.str()
		case '0' <= b && b <= '9':
			return c.number()
		case b == '{':
			return c.object()
		}
	}
	c.skipSpace()
	return c.value()
}

func (c *canonJSON) literal(lit string) error {
	if len(c.src)-c.pos < len(lit) || string(c.src[c.pos:c.pos+len(lit)]) != lit {
		return ErrInvalidJSON
	}
	c.pos += len(lit)
	return nil
}

func isDigit(b byte) bool { return '0' <= b && b <= '9' }

// number copies a number literal as it is, after checking its grammar.
func (c *canonJSON) number() error {
	src, i := c.src, c.pos
	if i < len(src) && src[i] == '-' {
		i++
	}
	switch {
	case i < len(src) && src[i] == '0':
		i++
	case i < len(src) && '1' <= src[i] && src[i] <= '9':
		for i++; i < len(src) && isDigit(src[i]); i++ {
		}
	default:
		c.pos = i
		return ErrInvalidJSON
	}
	if i < len(src) && src[i] == '.' {
		i++
		if i >= len(src) || !isDigit(src[i]) {
			c.pos = i
			return ErrInvalidJSON
		}
		for i++; i < len(src) && isDigit(src[i]); i++ {
		}
	}
	if i < len(src) && (src[i] == 'e' || src[i] == 'E') {
		i++
		if i < len(src) && (src[i] == '+' || src[i] == '-') {
			i++
		}
		if i >= len(src) || !isDigit(src[i]) {
			c.pos = i
			return ErrInvalidJSON
		}
		for i++; i < len(src) && isDigit(src[i]); i++ {
		}
	}
	c.pos = i
	return nil
}

func (c *canonJSON) array() error {
	if c.depth++; c.depth > MaxDepth {
		return ErrTooDeep
	}
	c.pos++
	c.skipSpace()
	if c.pos < len(c.src) && c.src[c.pos] == ']' {
		c.pos++
		c.depth--
		return nil
	}
	for {
		if err := c.memberValue(); err != nil {
			return err
		}
		c.skipSpace()
		if c.pos >= len(c.src) {
			return ErrInvalidJSON
		}
		switch c.src[c.pos] {
		case ',':
			c.pos++
		case ']':
			c.pos++
			c.depth--
			return nil
		default:
			return ErrInvalidJSON
		}
	}
}

func (c *canonJSON) object() error {
	if c.depth++; c.depth > MaxDepth {
		return ErrTooDeep
	}
	idx := len(c.objs)
	// The fields are stored one by one: a struct built whole and copied in
	// is read back in wider words than it was written, which stalls.
	c.objs = append(c.objs, object{})
	c.objs[idx].start = c.outLen()
	c.objs[idx].first = -1
	c.opened++
	opened := c.opened
	c.pos++
	memBase, foldBase := len(c.mem), len(c.fold)
	c.skipSpace()
	if c.pos < len(c.src) && c.src[c.pos] == '}' {
		c.pos++
	} else {
		for {
			if c.pos >= len(c.src) || c.src[c.pos] != '"' {
				return ErrInvalidJSON
			}
			start, foldStart, obj := c.outLen(), len(c.fold), len(c.objs)
			key, err := c.name()
			if err != nil {
				return err
			}
			foldEnd := len(c.fold)
			// Whitespace is looked for only where the byte expected is
			// not found.
			if c.pos >= len(c.src) || c.src[c.pos] != ':' {
				c.skipSpace()
				if c.pos >= len(c.src) || c.src[c.pos] != ':' {
					return ErrInvalidJSON
				}
			}
			c.pos++
			if err := c.memberValue(); err != nil {
				return err
			}
			c.mem = append(c.mem, member{})
			m := &c.mem[len(c.mem)-1]
			m.start, m.end = start, c.outLen()
			m.foldStart, m.foldEnd = foldStart, foldEnd
			m.obj, m.key = obj, key
			c.skipSpace()
			if c.pos >= len(c.src) {
				return ErrInvalidJSON
			}
			if c.src[c.pos] == '}' {
				c.pos++
				break
			}
			if c.src[c.pos] != ',' {
				return ErrInvalidJSON
			}
			c.pos++
			if c.pos >= len(c.src) || c.src[c.pos] != '"' {
				c.skipSpace()
			}
		}
	}
	c.depth--

	o := &c.objs[idx]
	o.end = c.outLen()
	o.next = len(c.objs)
	ms := c.mem[memBase:]
	var inOrder bool
	if len(ms) == 2 {
		// The commonest small object, tested inline.
		inOrder = !c.after(&ms[0], &ms[1])
	} else {
		inOrder = c.inOrder(ms)
	}
	if !inOrder && c.opened == opened && o.end-o.start <= maxRewrite {
		// No object inside: write the members in order where they stand.
		if len(ms) == 2 {
			ms[0], ms[1] = ms[1], ms[0] // the second sorts first
		} else {
			c.sortMembers(ms)
		}
		c.rewrite(o.start, o.end, ms)
		inOrder = true
	}
	switch {
	case inOrder && len(c.objs) == idx+1:
		// Nothing for emit to do within it.
		c.objs = c.objs[:idx]
	case !inOrder:
		c.sortMembers(ms)
		o.first = len(c.sorted)
		c.sorted = append(c.sorted, ms...)
		o.last = len(c.sorted)
		c.reorder = true
	}
	c.mem = c.mem[:memBase]
	c.fold = c.fold[:foldBase]
	return nil
}

// maxRewrite is the size of the largest object whose members the first pass
// puts in order where they stand.
const maxRewrite = 4 << 10

// rewrite writes the members ms of the object out[start:end], which holds
// no object and ends the canonical form so far, in the order of ms.
func (c *canonJSON) rewrite(start, end int, ms []member) {
	if len(c.out) <= start {
		// Nothing of the object has been copied to out: its bytes are
		// src's, and go to out in their new order straight from there.
		// out and src are held in locals: c.out written back after every
		// append cost a store of each word and a write barrier check.
		out, src := c.out, c.src
		at := c.run - len(out) // where in src a position in out is
		out = append(out, src[c.run:start+at+1]...)
		for k := range ms {
			m := &ms[k]
			if k > 0 {
				out = append(out, ',')
			}
			out = append(out, src[m.start+at:m.end+at]...)
		}
		c.out = append(out, '}')
		c.run = c.pos
		return
	}
	c.flush()
	c.tmp = append(c.tmp[:0], c.out[start:end]...)
	w := start + 1
	for k := range ms {
		m := &ms[k]
		if k > 0 {
			c.out[w] = ','
			w++
		}
		w += copy(c.out[w:], c.tmp[m.start-start:m.end-start])
	}
}

// inOrder reports whether ms is already sorted by folded name.
func (c *canonJSON) inOrder(ms []member) bool {
	for i := 1; i < len(ms); i++ {
		if c.after(&ms[i-1], &ms[i]) {
			return false
		}
	}
	return true
}

// sortMembers sorts ms by folded name, keeping the order of members whose
// names fold alike.
func (c *canonJSON) sortMembers(ms []member) {
	if len(ms) > 12 {
		slices.SortStableFunc(ms, func(a, b member) int { return c.compareMembers(&a, &b) })
		return
	}
	// Insertion sort: a member out of place is held while those before it
	// that sort after it move up one, each once.
	for i := 1; i < len(ms); i++ {
		if !c.after(&ms[i-1], &ms[i]) {
			continue
		}
		m := ms[i]
		j := i - 1
		for ms[j+1] = ms[j]; j > 0 && c.after(&ms[j-1], &m); j-- {
			ms[j] = ms[j-1]
		}
		ms[j] = m
	}
}

// after reports whether the folded name of a sorts after that of b. It
// compares the keys inline and calls compareMembers only when they are
// equal.
func (c *canonJSON) after(a, b *member) bool {
	if a.key != b.key {
		return a.key > b.key
	}
	return c.compareMembers(a, b) > 0
}
