package main

import (
	"bytes"
	"encoding/xml"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// svgDoc is what the tests read back from a chart.
type svgDoc struct {
	XMLName xml.Name  `xml:"svg"`
	Width   float64   `xml:"width,attr"`
	Title   string    `xml:"title"`
	Rects   []svgRect `xml:"rect"`
	Lines   []svgLine `xml:"line"`
	Texts   []string  `xml:"text"`
}

type svgRect struct {
	Class  string  `xml:"class,attr"`
	Label  string  `xml:"data-label,attr"`
	Ratio  string  `xml:"data-ratio,attr"`
	Target string  `xml:"data-target,attr"`
	X      float64 `xml:"x,attr"`
	Width  float64 `xml:"width,attr"`
	Fill   string  `xml:"fill,attr"`
}

type svgLine struct {
	Class  string  `xml:"class,attr"`
	Target string  `xml:"data-target,attr"`
	X1     float64 `xml:"x1,attr"`
	X2     float64 `xml:"x2,attr"`
}

func parseChart(t *testing.T, b []byte) svgDoc {
	t.Helper()
	var doc svgDoc
	if err := xml.Unmarshal(b, &doc); err != nil {
		t.Fatalf("the chart is not XML: %v\n%s", err, b)
	}
	return doc
}

func (d svgDoc) bars() []svgRect {
	var rs []svgRect
	for _, r := range d.Rects {
		if r.Class == "bar" {
			rs = append(rs, r)
		}
	}
	return rs
}

func (d svgDoc) targets() []svgLine {
	var ls []svgLine
	for _, l := range d.Lines {
		if l.Class == "target" {
			ls = append(ls, l)
		}
	}
	return ls
}

// checkChart checks that doc draws bars: one bar each, in order, its
// length the ratio on one scale shared by every bar, coloured by whether
// it meets its target, and the target's line at the target on that scale.
func checkChart(t *testing.T, doc svgDoc, bars []ratioBar) {
	t.Helper()
	rects, lines := doc.bars(), doc.targets()
	if len(rects) != len(bars) || len(lines) != len(bars) {
		t.Fatalf("%d bars and %d target lines for %d ratios", len(rects), len(lines), len(bars))
	}
	// The scale: pixels per unit of ratio, from the longest bar.
	scale := 0.0
	for i, b := range bars {
		if b.Ratio > 0 && rects[i].Width/b.Ratio > scale {
			scale = rects[i].Width / b.Ratio
		}
	}
	if scale <= 0 {
		t.Fatal("no bar has a length")
	}
	x0 := rects[0].X
	const px = 0.2 // the chart rounds positions to a tenth of a pixel, and so does the scale read back
	for i, b := range bars {
		r, l := rects[i], lines[i]
		if r.Label != b.Label() {
			t.Errorf("bar %d is labelled %q, want %q", i, r.Label, b.Label())
		}
		if got, err := strconv.ParseFloat(r.Ratio, 64); err != nil || math.Abs(got-b.Ratio) > 1e-4 {
			t.Errorf("bar %d carries ratio %q, want %.4f", i, r.Ratio, b.Ratio)
		}
		if r.X != x0 {
			t.Errorf("bar %d starts at %v, the others at %v", i, r.X, x0)
		}
		if want := b.Ratio * scale; math.Abs(r.Width-want) > px {
			t.Errorf("bar %d (%s, ratio %.2f) is %v long, want %v", i, b.Label(), b.Ratio, r.Width, want)
		}
		if want := x0 + b.Target*scale; math.Abs(l.X1-want) > px || l.X1 != l.X2 {
			t.Errorf("bar %d's target %.2f drawn at x %v..%v, want %v", i, b.Target, l.X1, l.X2, want)
		}
		if want := fillMet; b.Missed() != (r.Fill == fillMissed) || (!b.Missed() && r.Fill != want) {
			t.Errorf("bar %d (ratio %.2f, target %.2f) is %s", i, b.Ratio, b.Target, r.Fill)
		}
	}
	if right := x0 + scale*maxOf(bars); right > doc.Width {
		t.Errorf("the longest bar or target ends at %v, past the chart's width %v", right, doc.Width)
	}
}

func maxOf(bars []ratioBar) float64 {
	m := 0.0
	for _, b := range bars {
		m = max(m, b.Ratio, b.Target)
	}
	return m
}

func TestChartBarsMatchRatios(t *testing.T) {
	bars := []ratioBar{
		{What: "idemkey-redis / floor", Phase: fresh, Conns: 16, Ratio: 1.07, Target: 1.0},
		{What: "idemkey-redis / floor", Phase: fresh, Conns: 64, Ratio: 0.93, Target: 1.0},
		{What: "idemkey-redis+ap / floor", Phase: replay, Conns: 64, Ratio: 2.61, Target: 1.3},
		{What: "idemkey-memory / bare", Phase: replay, Conns: 16, Ratio: 0.5, Target: 0.9},
		{What: `a <label> & "quotes"`, Phase: replay, Conns: 1, Ratio: 0, Target: 0.75},
	}
	var buf bytes.Buffer
	if err := writeChart(&buf, "ratios & targets", bars); err != nil {
		t.Fatal(err)
	}
	doc := parseChart(t, buf.Bytes())
	if doc.Title != "ratios & targets" {
		t.Errorf("title %q", doc.Title)
	}
	checkChart(t, doc, bars)
	for _, want := range []string{"1.07", "0.93", "2.61", "0.50", "0.00"} {
		if !strings.Contains(strings.Join(doc.Texts, "\n"), want) {
			t.Errorf("no value %s printed beside its bar", want)
		}
	}

	// No bars: still a chart, with its scale and legend.
	buf.Reset()
	if err := writeChart(&buf, "empty", nil); err != nil {
		t.Fatal(err)
	}
	if doc := parseChart(t, buf.Bytes()); len(doc.bars()) != 0 {
		t.Errorf("%d bars for no ratios", len(doc.bars()))
	}
}

// TestChartFromResults: the chart's bars are the ratios the driver prints
// as its targets, computed from the cells' requests per second.
func TestChartFromResults(t *testing.T) {
	cell := func(reqPerSec float64) *cellAgg {
		return &cellAgg{requests: int64(reqPerSec * 3), elapsed: 3 * time.Second}
	}
	results := map[cellKey]*cellAgg{
		{scRedis, 16, fresh}:   cell(9000),
		{scFloor, 16, fresh}:   cell(8000),
		{scRedis, 64, fresh}:   cell(7200),
		{scFloor, 64, fresh}:   cell(8000),
		{scTypical, 16, fresh}: cell(5000),
		{scTypical, 64, fresh}: cell(3800),
	}
	scs := []string{scFloor, scTypical, scRedis}
	var out bytes.Buffer
	bars := targets(&out, scs, []int{16, 64}, []phase{fresh}, results)
	want := []ratioBar{
		{"idemkey-redis / floor", fresh, 16, 9000.0 / 8000, 0.95},
		{"idemkey-redis / floor", fresh, 64, 7200.0 / 8000, 0.95},
		{"idemkey-redis / typical", fresh, 16, 9000.0 / 5000, 1.0},
		{"idemkey-redis / typical", fresh, 64, 7200.0 / 3800, 1.0},
	}
	if len(bars) != len(want) {
		t.Fatalf("bars %+v, want %+v", bars, want)
	}
	for i := range want {
		if bars[i].Label() != want[i].Label() || math.Abs(bars[i].Ratio-want[i].Ratio) > 1e-9 || bars[i].Target != want[i].Target {
			t.Errorf("bar %d: %+v, want %+v", i, bars[i], want[i])
		}
	}
	for _, line := range []string{
		"idemkey-redis / floor            first run >= 0.95: 16 conns 1.12, 64 conns 0.90*",
		"idemkey-redis / typical          first run >= 1.00: 16 conns 1.80, 64 conns 1.89",
	} {
		if !strings.Contains(out.String(), line) {
			t.Errorf("printed targets lack %q:\n%s", line, out.String())
		}
	}

	path := filepath.Join(t.TempDir(), "targets.svg")
	if err := writeChartFile(path, "load", bars); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	checkChart(t, parseChart(t, b), bars)
}
