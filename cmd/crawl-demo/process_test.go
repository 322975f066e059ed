package main

import (
	"bufio"
	"bytes"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetgate/fleetgate/internal/fakesite"
	"github.com/fleetgate/fleetgate/internal/redistest"
)

// buildBinary builds crawl-demo into a temporary directory.
func buildBinary(t *testing.T) string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	require.NoError(t, err, "the go command is needed to build crawl-demo")
	bin := filepath.Join(t.TempDir(), "crawl-demo")
	out, err := exec.Command(goTool, "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	return bin
}

// crawlProcess is one crawl-demo process started by a test.
type crawlProcess struct {
	cmd            *exec.Cmd
	stdout, stderr bytes.Buffer
}

func startCrawl(t *testing.T, bin string, args ...string) *crawlProcess {
	t.Helper()
	p := &crawlProcess{cmd: exec.Command(bin, args...)}
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	require.NoError(t, p.cmd.Start())
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Kill()
			_ = p.cmd.Wait()
		}
	})
	return p
}

// urlFile writes n URLs under base/name/ to a file.
func urlFile(t *testing.T, base, name string, n int) (string, []string) {
	t.Helper()
	urls := make([]string, n)
	for i := range urls {
		urls[i] = fmt.Sprintf("%s/%s/%d", base, name, i)
	}
	return writeFile(t, urls...), urls
}

// TestTwoProcessesShareOneQuota runs two crawl-demo processes at once
// against one counting site. Sharing a Redis, together they keep the rule;
// each on its own embedded store, they send twice as much (the control).
func TestTwoProcessesShareOneQuota(t *testing.T) {
	bin := buildBinary(t)
	rdb := redistest.StartServer(t)
	const limit, window = 10, time.Second
	tests := []struct {
		name     string
		perProc  int
		store    []string
		maxPeak  int
		minPeak  int
		duration time.Duration // at least
	}{
		{"shared redis", 40, []string{"-redis", rdb.URL()}, limit, limit, 7 * time.Second},
		{"control: two embedded stores", 20, nil, 2 * limit, limit + 1, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			site := fakesite.New(fakesite.Config{}) // counts, limits nothing
			srv := httptest.NewServer(site)
			defer srv.Close()

			var procs []*crawlProcess
			var files [][]string
			start := time.Now()
			for _, name := range []string{"a", "b"} {
				file, urls := urlFile(t, srv.URL, name, tt.perProc)
				files = append(files, urls)
				args := append([]string{"-urls", file, "-rule", fmt.Sprintf("127.0.0.1=%d/%v", limit, window), "-margin", "50ms", "-workers", "8"}, tt.store...)
				procs = append(procs, startCrawl(t, bin, args...))
			}
			for i, p := range procs {
				require.NoError(t, p.cmd.Wait(), "process %d: %s", i, p.stderr.String())
				res := decodeLines(t, p.stdout.String())
				got := map[string]result{}
				for _, r := range res {
					got[r.URL] = r
				}
				require.Len(t, got, len(res), "process %d: one line per URL", i)
				for _, u := range files[i] {
					require.Equal(t, result{URL: u, Status: 200, Attempts: 1}, got[u], "process %d", i)
				}
			}
			elapsed := time.Since(start)
			st := site.Stats()
			require.Equal(t, 2*tt.perProc, st.Requests)
			peak := fakesite.Peak(st.Arrivals, window)
			t.Logf("%d requests in %v, peak %d in any %v", st.Requests, elapsed.Round(time.Millisecond), peak, window)
			require.LessOrEqual(t, peak, tt.maxPeak)
			require.GreaterOrEqual(t, peak, tt.minPeak)
			require.GreaterOrEqual(t, elapsed, tt.duration)
		})
	}
}

// TestServeAndTarget runs the two-terminal demo: a -serve process and a
// -target fleet sharing Redis, then stops the site with SIGINT.
func TestServeAndTarget(t *testing.T) {
	bin := buildBinary(t)
	rdb := redistest.StartServer(t)
	dir := t.TempDir()

	serve := exec.Command(bin, "-serve", "127.0.0.1:0", "-chart", filepath.Join(dir, "site.svg"))
	stdout, err := serve.StdoutPipe()
	require.NoError(t, err)
	var serveErr bytes.Buffer
	serve.Stderr = &serveErr
	require.NoError(t, serve.Start())
	t.Cleanup(func() {
		if serve.ProcessState == nil {
			_ = serve.Process.Kill()
			_ = serve.Wait()
		}
	})
	lines := bufio.NewScanner(stdout)
	require.True(t, lines.Scan(), "the site prints its address")
	first := lines.Text()
	_, siteURL, ok := strings.Cut(first, "serving the demo site at ")
	require.True(t, ok, "first line: %q", first)

	fleet := startCrawl(t, bin, "-redis", rdb.URL(), "-target", siteURL, "-pages", "30", "-chart", filepath.Join(dir, "fleet.svg"))
	require.NoError(t, fleet.cmd.Wait(), "fleet: %s\n%s", fleet.stdout.String(), fleet.stderr.String())
	require.Contains(t, fleet.stdout.String(), "result: no ban; at most")

	require.NoError(t, serve.Process.Signal(syscall.SIGINT))
	var rest strings.Builder
	for lines.Scan() {
		rest.WriteString(lines.Text() + "\n")
	}
	require.NoError(t, serve.Wait(), "serve: %s\n%s", rest.String(), serveErr.String())
	require.Regexp(t, `\n127\.0\.0\.1\s+30\s+30\s+0\s+0\s+0\s+`, rest.String(), "the row names the target, without the port")
	require.Contains(t, rest.String(), "as the site saw them")
	_, err = os.Stat(filepath.Join(dir, "site.svg"))
	require.NoError(t, err)
}

// TestSignalStopsTheCrawl sends SIGINT to a crawling process: it stops
// reading, writes a line for every URL it read and exits 1.
func TestSignalStopsTheCrawl(t *testing.T) {
	bin := buildBinary(t)
	srv, _ := countingServer(t)
	file, urls := urlFile(t, srv.URL, "s", 300)
	p := startCrawl(t, bin, "-urls", file, "-rule", "127.0.0.1=5/1s", "-workers", "4")
	time.Sleep(1500 * time.Millisecond) // a few pages fetched, many waiting
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGINT))
	start := time.Now()
	err := p.cmd.Wait()
	require.Less(t, time.Since(start), 2*time.Second, "it stops promptly")
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "stderr: %s", p.stderr.String())
	require.Equal(t, 1, exit.ExitCode())

	res := decodeLines(t, p.stdout.String())
	require.Less(t, len(res), len(urls))
	lines := map[string]result{}
	for _, r := range res {
		lines[r.URL] = r
	}
	require.Len(t, lines, len(res), "one line per URL")
	var ok, stopped int
	for _, u := range urls[:len(res)] {
		r, found := lines[u]
		require.True(t, found, "URL %s was read but has no line", u)
		switch r.Error {
		case "":
			ok++
		case interrupted:
			stopped++
		default:
			t.Fatalf("unexpected line %+v", r)
		}
	}
	require.Positive(t, ok)
	require.Positive(t, stopped)
}
