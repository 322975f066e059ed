package main

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/fleetgate/fleetgate/internal/fakesite"
)

// Chart geometry, in SVG user units.
const (
	chartWidth  = 960
	chartHeight = 560
	plotLeft    = 70
	plotRight   = 930
	// The upper panel: requests per tick.
	topY0, topY1 = 70, 270
	// The lower panel: requests in the window ending at each instant.
	lowY0, lowY1 = 340, 520
)

// chartTick is the width of one bar of the upper panel.
const chartTick = 100 * time.Millisecond

// rollingStep is the resolution of the lower panel.
const rollingStep = 20 * time.Millisecond

// chart is what the demo plots: the arrivals a site saw against its limit.
type chart struct {
	Title    string
	Arrivals []time.Time
	Start    time.Time // the x axis' 0
	Limit    int       // the site's limit per Window
	Window   time.Duration
}

// write writes the chart to path as a self-contained SVG file.
func (c chart) write(path string) error {
	if err := os.WriteFile(path, c.svg(), 0o644); err != nil {
		return fmt.Errorf("write chart: %w", err)
	}
	return nil
}

// svg renders the chart: requests per chartTick as bars against the pace
// the limit allows, and above it the number of requests in the window
// ending at each instant against the limit itself.
func (c chart) svg() []byte {
	arr := slices.Clone(c.Arrivals)
	slices.SortFunc(arr, time.Time.Compare)
	length := c.Window // of the x axis, in whole seconds
	if len(arr) > 0 {
		length = max(length, arr[len(arr)-1].Sub(c.Start))
	}
	length = (length + time.Second - 1).Truncate(time.Second)
	perTick := fakesite.PerTick(arr, c.Start, chartTick)
	roll := rolling(arr, c.Start, length, c.Window, rollingStep)
	pace := float64(c.Limit) * float64(chartTick) / float64(c.Window)
	peak := slices.Max(append([]int{0}, roll...))

	var b bytes.Buffer
	x := func(d time.Duration) float64 {
		return plotLeft + float64(plotRight-plotLeft)*d.Seconds()/length.Seconds()
	}
	fmt.Fprintf(&b, `<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">
<rect width="100%%" height="100%%" fill="white"/>
<text x="%d" y="28" font-size="16" font-weight="bold">%s</text>
`, chartWidth, chartHeight, chartWidth, chartHeight, plotLeft, esc(c.Title))

	// Upper panel: bars per tick and the limit's pace.
	topMax := niceCeil(max(float64(slices.Max(append([]int{0}, perTick...))), pace) * 1.15)
	yTop := func(v float64) float64 { return topY1 - (topY1-topY0)*v/topMax }
	fmt.Fprintf(&b, `<text x="%d" y="%d" font-weight="bold">Requests per %v</text>`+"\n", plotLeft, topY0-12, chartTick)
	axes(&b, x, length, topY0, topY1, topMax, yTop)
	barW := x(chartTick) - x(0)
	for k, n := range perTick {
		if n == 0 {
			continue
		}
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#4a7ebb"/>`+"\n",
			x(time.Duration(k)*chartTick)+0.5, yTop(float64(n)), max(barW-1, 0.5), yTop(0)-yTop(float64(n)))
	}
	limitLine(&b, yTop(pace), fmt.Sprintf("the limit's pace: %s per %v (%d per %v)", trimFloat(pace), chartTick, c.Limit, c.Window))

	// Lower panel: requests in the window ending at each instant.
	lowMax := niceCeil(float64(max(peak, c.Limit)) * 1.15)
	yLow := func(v float64) float64 { return lowY1 - (lowY1-lowY0)*v/lowMax }
	fmt.Fprintf(&b, `<text x="%d" y="%d" font-weight="bold">Requests in the last %v (sliding window), peak %d</text>`+"\n", plotLeft, lowY0-12, c.Window, peak)
	axes(&b, x, length, lowY0, lowY1, lowMax, yLow)
	var pts strings.Builder
	for k, n := range roll {
		t0, t1 := time.Duration(k)*rollingStep, time.Duration(k+1)*rollingStep
		fmt.Fprintf(&pts, "%.1f,%.1f %.1f,%.1f ", x(t0), yLow(float64(n)), x(min(t1, length)), yLow(float64(n)))
	}
	fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="#4a7ebb" stroke-width="1.5"/>`+"\n", strings.TrimSpace(pts.String()))
	limitLine(&b, yLow(float64(c.Limit)), fmt.Sprintf("the limit: %d per %v", c.Limit, c.Window))
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">seconds</text>`+"\n", (plotLeft+plotRight)/2, chartHeight-8)
	b.WriteString("</svg>\n")
	return b.Bytes()
}

// axes draws a panel's frame, its y grid and its x ticks in seconds.
func axes(b *bytes.Buffer, x func(time.Duration) float64, length time.Duration, y0, y1 int, yMax float64, y func(float64) float64) {
	fmt.Fprintf(b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#999"/>`+"\n", plotLeft, y0, plotRight-plotLeft, y1-y0)
	step := niceStep(yMax / 4)
	for v := 0.0; v <= yMax+1e-9; v += step {
		fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#eee"/>`+"\n", plotLeft+1, y(v), plotRight-1, y(v))
		fmt.Fprintf(b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", plotLeft-6, y(v)+4, trimFloat(v))
	}
	every := time.Second * time.Duration(niceStep(length.Seconds()/15))
	for t := time.Duration(0); t <= length; t += every {
		fmt.Fprintf(b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#999"/>`+"\n", x(t), y1, x(t), y1+4)
		fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x(t), y1+16, trimFloat(t.Seconds()))
	}
}

// limitLine draws a dashed red horizontal line at y, labelled.
func limitLine(b *bytes.Buffer, y float64, label string) {
	fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#d62728" stroke-width="1.5" stroke-dasharray="6 4"/>`+"\n", plotLeft, y, plotRight, y)
	fmt.Fprintf(b, `<text x="%d" y="%.1f" text-anchor="end" fill="#d62728">%s</text>`+"\n", plotRight-4, y-5, esc(label))
}

// rolling returns, for each step of [start, start+length], the largest
// number of sorted arrivals in a closed interval of length window that ends
// within the step or at its end. Its maximum is fakesite.Peak of the
// arrivals from start on.
func rolling(sorted []time.Time, start time.Time, length, window, step time.Duration) []int {
	out := make([]int, (length+step-1)/step)
	j := 0 // the next arrival to count
	for j < len(sorted) && sorted[j].Before(start) {
		j++
	}
	i := j // the earliest arrival in the window
	for k := range out {
		end := start.Add(time.Duration(k+1) * step)
		best := 0
		for ; j < len(sorted) && sorted[j].Before(end); j++ {
			for sorted[j].Sub(sorted[i]) > window {
				i++
			}
			best = max(best, j-i+1)
		}
		for i < j && end.Sub(sorted[i]) > window {
			i++
		}
		out[k] = max(best, j-i)
	}
	return out
}

// niceStep returns 1, 2 or 5 times a power of ten, at least v (and 1 at
// least).
func niceStep(v float64) float64 {
	if v <= 1 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

// niceCeil rounds v up to a multiple of a nice step for four grid lines.
func niceCeil(v float64) float64 {
	s := niceStep(v / 4)
	return math.Ceil(v/s) * s
}

// trimFloat formats v with at most one decimal, none when it is whole.
func trimFloat(v float64) string {
	if v == math.Trunc(v) {
		return fmt.Sprint(int64(v))
	}
	return fmt.Sprintf("%.1f", v)
}

// esc escapes s for SVG text and attributes.
func esc(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s)) // a strings.Builder does not fail
	return b.String()
}
