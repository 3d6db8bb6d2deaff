package main

import (
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/template"
)

// target is a ratio the project holds itself to: sc's requests per second
// over base's, in phase ph, at least min.
type target struct {
	what     string
	sc, base string
	ph       phase
	min      float64
}

// ratioBar is one measured target at one concurrency: a bar of the chart
// and one entry of the printed targets.
type ratioBar struct {
	What   string // "idemkey-redis / floor"
	Phase  phase
	Conns  int
	Ratio  float64 // sc's req/s over base's
	Target float64 // the least Ratio the target allows
}

// Label names the bar.
func (b ratioBar) Label() string { return fmt.Sprintf("%s, %s, %d conns", b.What, b.Phase, b.Conns) }

// Missed reports whether the ratio falls short of its target.
func (b ratioBar) Missed() bool { return b.Ratio < b.Target }

// measure returns a bar for each target whose scenarios and phase ran, at
// every concurrency, in the order of ts and then of connsList.
func measure(ts []target, scs []string, connsList []int, phases []phase, results map[cellKey]*cellAgg) []ratioBar {
	var bars []ratioBar
	for _, t := range ts {
		if !slices.Contains(scs, t.sc) || !slices.Contains(scs, t.base) || !slices.Contains(phases, t.ph) {
			continue
		}
		for _, conns := range connsList {
			c, b := results[cellKey{t.sc, conns, t.ph}], results[cellKey{t.base, conns, t.ph}]
			r := 0.0
			if c != nil && b != nil && b.rate() > 0 {
				r = c.rate() / b.rate()
			}
			bars = append(bars, ratioBar{What: t.what, Phase: t.ph, Conns: conns, Ratio: r, Target: t.min})
		}
	}
	return bars
}

// printTargets prints bars as the table's targets: one line per target,
// its ratio at each concurrency, a miss marked with *. width pads the
// target's name.
func printTargets(w io.Writer, width int, bars []ratioBar) {
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Targets (req/s ratios; * marks a miss):")
	for i := 0; i < len(bars); {
		j := i
		var parts []string
		for ; j < len(bars) && bars[j].What == bars[i].What && bars[j].Phase == bars[i].Phase; j++ {
			mark := ""
			if bars[j].Missed() {
				mark = "*"
			}
			parts = append(parts, fmt.Sprintf("%d conns %.2f%s", bars[j].Conns, bars[j].Ratio, mark))
		}
		fmt.Fprintf(w, "  %-*s %-9s >= %.2f: %s\n", width, bars[i].What, bars[i].Phase, bars[i].Target, strings.Join(parts, ", "))
		i = j
	}
}

// The chart's geometry, in SVG user units (pixels).
const (
	chartWidth  = 900
	chartLabelW = 360 // the labels' column, left of the bars
	chartRight  = 60  // room right of the longest bar for its value
	chartTop    = 48  // the title and the scale
	chartRow    = 22  // one bar's row
	chartBarH   = 14  // one bar's height
	chartBottom = 40  // the legend
)

// chartData is what the template draws, every position worked out.
type chartData struct {
	Title         string
	Width, Height int
	TitleX        float64
	X0            float64 // where the bars start: ratio 0
	Bars          []chartBar
	Ticks         []chartTick
	TickY1        int // the scale's lines run from TickY1 to TickY2
	TickY2        int
	TickLabelY    int
	Legend        chartLegend
}

type chartBar struct {
	ratioBar
	Y, H      int     // the bar's top and height
	TextY     int     // its label's baseline
	W         float64 // its length
	TargetX   float64 // where its target's line is drawn
	LineY1    int
	LineY2    int
	ValueX    float64
	Fill      string
	Formatted string
}

type chartTick struct {
	X     float64
	Label string
}

type chartLegend struct {
	Y, BoxY, LineY1, LineY2                              int
	MeetX, MeetTextX, MissX, MissTextX, LineX, LineTextX float64
}

// The bars' colours.
const (
	fillMet    = "#4a7ebb"
	fillMissed = "#c0504d"
)

var chartTemplate = template.Must(template.New("chart").Funcs(template.FuncMap{
	"esc": template.HTMLEscapeString,
	"f":   func(x float64) string { return strconv.FormatFloat(x, 'f', 1, 64) },
	"r":   func(x float64) string { return strconv.FormatFloat(x, 'f', 4, 64) },
}).Parse(`<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="{{.Width}}" height="{{.Height}}" viewBox="0 0 {{.Width}} {{.Height}}" font-family="sans-serif" font-size="12">
<title>{{esc .Title}}</title>
<rect width="{{.Width}}" height="{{.Height}}" fill="white"/>
<text x="{{f .TitleX}}" y="18" text-anchor="middle" font-size="14" font-weight="bold">{{esc .Title}}</text>
{{- range .Ticks}}
<line class="tick" x1="{{f .X}}" y1="{{$.TickY1}}" x2="{{f .X}}" y2="{{$.TickY2}}" stroke="#ddd"/>
<text x="{{f .X}}" y="{{$.TickLabelY}}" text-anchor="middle" fill="#555">{{.Label}}</text>
{{- end}}
{{- range .Bars}}
<text x="{{f $.X0}}" dx="-8" y="{{.TextY}}" text-anchor="end">{{esc .Label}}</text>
<rect class="bar" data-label="{{esc .Label}}" data-ratio="{{r .Ratio}}" data-target="{{r .Target}}" x="{{f $.X0}}" y="{{.Y}}" width="{{f .W}}" height="{{.H}}" fill="{{.Fill}}"/>
<line class="target" data-target="{{r .Target}}" x1="{{f .TargetX}}" y1="{{.LineY1}}" x2="{{f .TargetX}}" y2="{{.LineY2}}" stroke="black" stroke-width="2"/>
<text x="{{f .ValueX}}" y="{{.TextY}}">{{.Formatted}}</text>
{{- end}}
{{- with .Legend}}
<rect x="{{f .MeetX}}" y="{{.BoxY}}" width="12" height="12" fill="` + fillMet + `"/>
<text x="{{f .MeetTextX}}" y="{{.Y}}">meets its target</text>
<rect x="{{f .MissX}}" y="{{.BoxY}}" width="12" height="12" fill="` + fillMissed + `"/>
<text x="{{f .MissTextX}}" y="{{.Y}}">misses it</text>
<line x1="{{f .LineX}}" y1="{{.LineY1}}" x2="{{f .LineX}}" y2="{{.LineY2}}" stroke="black" stroke-width="2"/>
<text x="{{f .LineTextX}}" y="{{.Y}}">target (req/s ratio against the baseline)</text>
{{- end}}
</svg>
`))

// writeChart draws bars as an SVG horizontal bar chart: one bar per
// ratio, from zero, blue when it meets its target and red when it misses,
// each with its target drawn as a black line across it, and a scale in
// steps of 0.25 from 0 to past the largest ratio and target.
func writeChart(w io.Writer, title string, bars []ratioBar) error {
	top := 1.0
	for _, b := range bars {
		top = max(top, b.Ratio, b.Target)
	}
	top = math.Ceil(top*1.05*4) / 4 // a quarter past the longest, at least 1
	height := chartTop + len(bars)*chartRow + chartBottom
	x0, x1 := float64(chartLabelW), float64(chartWidth-chartRight)
	legend := height - 12
	d := chartData{
		Title:      title,
		Width:      chartWidth,
		Height:     height,
		TitleX:     chartWidth / 2,
		X0:         x0,
		TickY1:     chartTop - 8,
		TickY2:     chartTop + len(bars)*chartRow,
		TickLabelY: chartTop - 12,
		Legend: chartLegend{
			Y: legend, BoxY: legend - 10, LineY1: legend - 11, LineY2: legend + 2,
			MeetX: x0, MeetTextX: x0 + 18, MissX: x0 + 140, MissTextX: x0 + 158,
			LineX: x0 + 250, LineTextX: x0 + 258,
		},
	}
	scale := (x1 - x0) / top
	for i := 0; float64(i)*0.25 <= top+1e-9; i++ {
		v := float64(i) * 0.25
		d.Ticks = append(d.Ticks, chartTick{X: x0 + v*scale, Label: strconv.FormatFloat(v, 'f', 2, 64)})
	}
	for i, b := range bars {
		y := chartTop + i*chartRow + (chartRow-chartBarH)/2
		fill := fillMet
		if b.Missed() {
			fill = fillMissed
		}
		d.Bars = append(d.Bars, chartBar{
			ratioBar:  b,
			Y:         y,
			H:         chartBarH,
			TextY:     y + chartBarH - 3,
			W:         b.Ratio * scale,
			TargetX:   x0 + b.Target*scale,
			LineY1:    y - 3,
			LineY2:    y + chartBarH + 3,
			ValueX:    x0 + b.Ratio*scale + 6,
			Fill:      fill,
			Formatted: strconv.FormatFloat(b.Ratio, 'f', 2, 64),
		})
	}
	return chartTemplate.Execute(w, d)
}

// writeChartFile writes the chart of bars to path.
func writeChartFile(path, title string, bars []ratioBar) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := writeChart(f, title, bars); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
