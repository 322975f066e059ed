package main

import (
	"context"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetgate/fleetgate/internal/fakesite"
	"github.com/fleetgate/fleetgate/internal/redistest"
)

// svgSummary parses an SVG file with encoding/xml and counts its elements
// by name.
func svgSummary(t *testing.T, path string) map[string]int {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	dec := xml.NewDecoder(f)
	counts := map[string]int{}
	root := ""
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err, "the chart is well-formed XML")
		if se, ok := tok.(xml.StartElement); ok {
			if root == "" {
				root = se.Name.Space + " " + se.Name.Local
			}
			counts[se.Name.Local]++
		}
	}
	require.Equal(t, "http://www.w3.org/2000/svg svg", root)
	return counts
}

func TestDemo(t *testing.T) {
	chart := filepath.Join(t.TempDir(), "chart.svg")
	start := time.Now()
	got := runCmd(context.Background(), t, "", "-pages", "60", "-chart", chart)
	require.Equal(t, 0, got.code, "stdout: %s\nstderr: %s", got.stdout, got.stderr)
	require.Less(t, time.Since(start), 10*time.Second)
	require.Contains(t, got.stdout, "result: no ban")
	require.Contains(t, got.stdout, "chart: "+chart)
	// The row names the quota's target, the host without the site's port.
	require.Regexp(t, `\n127\.0\.0\.1\s+60\s+60\s+0\s+0\s+0\s+(1\d|20) of 20 per 1s\s+(1\d|20)\.\d/s \(20\.0/s\)`, got.stdout, "table row")
	require.Contains(t, got.stderr, "progress: ", "stderr is not a terminal: plain progress lines")
	counts := svgSummary(t, chart)
	require.Positive(t, counts["rect"], "bars")
	require.Equal(t, 1, counts["polyline"], "the sliding-window line")
}

func TestDemoTooGenerousRuleGetsBanned(t *testing.T) {
	chart := filepath.Join(t.TempDir(), "chart.svg")
	got := runCmd(context.Background(), t, "", "-pages", "60", "-chart", chart, "-rule", "127.0.0.1=30/1s", "-retries", "0")
	require.Equal(t, 1, got.code, "stdout: %s\nstderr: %s", got.stdout, got.stderr)
	require.Contains(t, got.stdout, "result: BANNED")
	svgSummary(t, chart)
}

func TestDemoOnRedis(t *testing.T) {
	srv := redistest.StartServer(t)
	chart := filepath.Join(t.TempDir(), "chart.svg")
	got := runCmd(context.Background(), t, "", "-pages", "30", "-chart", chart, "-redis", srv.URL())
	require.Equal(t, 0, got.code, "stdout: %s\nstderr: %s", got.stdout, got.stderr)
	require.Contains(t, got.stdout, "Redis at "+srv.URL())
	require.Contains(t, got.stdout, "result: no ban")
}

// TestDemoThatFetchesNothingFails: a -target that does not answer bans
// no one, but a run that fetched none of its pages is not a success.
func TestDemoThatFetchesNothingFails(t *testing.T) {
	chart := filepath.Join(t.TempDir(), "chart.svg")
	got := runCmd(context.Background(), t, "", "-pages", "3", "-chart", chart, "-target", "http://127.0.0.1:1", "-retries", "0")
	require.Equal(t, 1, got.code, "stdout: %s\nstderr: %s", got.stdout, got.stderr)
	require.Contains(t, got.stdout, "result: no ban, but 3 pages were not fetched")
}

// TestDemoCountsOnlyRequestsThatReachedTheTarget: a dial that fails is
// no request, as the crawler's attempts count it: against a port where
// every dial is refused the table shows none, and so does the verdict.
func TestDemoCountsOnlyRequestsThatReachedTheTarget(t *testing.T) {
	chart := filepath.Join(t.TempDir(), "chart.svg")
	got := runCmd(context.Background(), t, "", "-pages", "5", "-chart", chart, "-target", "http://127.0.0.1:1", "-retries", "1")
	require.Equal(t, 1, got.code, "stdout: %s\nstderr: %s", got.stdout, got.stderr)
	require.Regexp(t, `\n127\.0\.0\.1\s+0\s+0\s+0\s+0\s+\?\s+0 of 20 per 1s\s+0\.0/s`, got.stdout, "table row")
	require.Contains(t, got.stdout, "result: no ban, but 5 pages were not fetched (-v shows why); at most 0 requests in any 1s")
}

// TestDemoNeverShowsTheTargetsPassword: a password in -target is shown as
// xxxxx, whether the demo runs or the flag is refused.
func TestDemoNeverShowsTheTargetsPassword(t *testing.T) {
	chart := filepath.Join(t.TempDir(), "chart.svg")
	got := runCmd(context.Background(), t, "", "-pages", "1", "-chart", chart, "-target", "http://u:PwLeak1@127.0.0.1:1", "-retries", "0")
	require.Equal(t, 1, got.code, "stdout: %s\nstderr: %s", got.stdout, got.stderr)
	require.Contains(t, got.stdout, "from http://u:xxxxx@127.0.0.1:1\n")

	bad := runCmd(context.Background(), t, "", "-target", "ftp://u:PwLeak2@127.0.0.1:1")
	require.Equal(t, 2, bad.code, "stderr: %s", bad.stderr)
	require.Contains(t, bad.stderr, `-target "ftp://u:xxxxx@127.0.0.1:1"`)
	for _, got := range []string{got.stdout, got.stderr, bad.stdout, bad.stderr} {
		require.NotContains(t, got, "PwLeak")
	}
}

func TestDemoInterrupted(t *testing.T) {
	chart := filepath.Join(t.TempDir(), "chart.svg")
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(500*time.Millisecond, cancel)
	start := time.Now()
	got := runCmd(ctx, t, "", "-chart", chart)
	require.Less(t, time.Since(start), 3*time.Second)
	require.Equal(t, 1, got.code, "stdout: %s\nstderr: %s", got.stdout, got.stderr)
	require.Contains(t, got.stdout, "result: interrupted; no ban so far")
	svgSummary(t, chart)
}

func TestRollingMatchesPeak(t *testing.T) {
	base := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	var arrivals []time.Time
	for i := range 200 { // an uneven pattern with bursts
		arrivals = append(arrivals, base.Add(time.Duration(i*i%997)*7*time.Millisecond))
	}
	sorted := append([]time.Time(nil), arrivals...)
	slices.SortFunc(sorted, time.Time.Compare)
	for _, w := range []time.Duration{100 * time.Millisecond, time.Second, 3 * time.Second} {
		roll := rolling(sorted, base, 8*time.Second, w, rollingStep)
		peak := 0
		for _, v := range roll {
			peak = max(peak, v)
		}
		require.Equal(t, fakesite.Peak(arrivals, w), peak, "window %v", w)
	}
}
