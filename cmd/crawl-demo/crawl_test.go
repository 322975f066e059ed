package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetgate/fleetgate/internal/fakesite"
	"github.com/fleetgate/fleetgate/internal/redistest"
	"github.com/fleetgate/fleetgate/throttle"
)

func TestCrawlWritesJSONLines(t *testing.T) {
	srv, hits := countingServer(t)
	urls := []string{srv.URL + "/a", srv.URL + "/b?x=1&y=<2>", srv.URL + "/c"}
	file := writeFile(t, urls...)
	out := filepath.Join(t.TempDir(), "out.jsonl")
	tests := []struct {
		name  string
		stdin string
		args  []string
		read  func(o outcome) string
	}{
		{"file to stdout", "", []string{"-urls", file}, func(o outcome) string { return o.stdout }},
		{"stdin to stdout", strings.Join(urls, "\n"), []string{"-urls", "-"}, func(o outcome) string { return o.stdout }},
		{"file to -out", "", []string{"-urls", file, "-out", out}, func(o outcome) string {
			require.Empty(t, o.stdout)
			b, err := os.ReadFile(out)
			require.NoError(t, err)
			return string(b)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hits.Store(0)
			got := runCmd(context.Background(), t, tt.stdin, append(tt.args, "-rule", "127.0.0.1=100/1s")...)
			require.Equal(t, 0, got.code, "stderr: %s", got.stderr)
			res := decodeLines(t, tt.read(got))
			slices.SortFunc(res, func(a, b result) int { return strings.Compare(a.URL, b.URL) })
			want := make([]result, len(urls))
			for i, u := range urls {
				want[i] = result{URL: u, Status: 200, Attempts: 1}
			}
			require.Equal(t, want, res)
			require.EqualValues(t, len(urls), hits.Load())
			require.Contains(t, tt.read(got), `"url":"`+urls[1]+`"`, "URLs are not HTML-escaped")
		})
	}
}

func TestCrawlMixedFile(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/missing" {
			http.NotFound(w, r)
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	defer srv.Close()
	file := writeFile(t,
		srv.URL+"/one",
		"",
		"# a comment",
		"   ",
		"   # an indented comment",
		"not a url",
		"ftp://x/y",
		"http://",
		"  "+srv.URL+"/two  ",
		srv.URL+"/missing",
		"/relative/path",
	)
	got := runCmd(context.Background(), t, "", "-urls", file, "-rule", "127.0.0.1=100/1s", "-retries", "0")
	require.Equal(t, 1, got.code, "stderr: %s", got.stderr)
	res := decodeLines(t, got.stdout)
	byURL := map[string]result{}
	for _, r := range res {
		_, dup := byURL[r.URL]
		require.False(t, dup, "two lines for %q", r.URL)
		byURL[r.URL] = r
	}
	want := map[string]result{
		srv.URL + "/one":     {URL: srv.URL + "/one", Status: 200, Attempts: 1},
		srv.URL + "/two":     {URL: srv.URL + "/two", Status: 200, Attempts: 1},
		srv.URL + "/missing": {URL: srv.URL + "/missing", Status: 404, Attempts: 1, Error: "HTTP 404 Not Found"},
		"not a url":          {URL: "not a url", Error: "not an absolute URL: want http:// or https://"},
		"ftp://x/y":          {URL: "ftp://x/y", Error: `scheme "ftp": want http or https`},
		"http://":            {URL: "http://", Error: "no host"},
		"/relative/path":     {URL: "/relative/path", Error: "not an absolute URL: want http:// or https://"},
	}
	require.Equal(t, want, byURL)
}

func TestCrawlOverlongLine(t *testing.T) {
	srv, hits := countingServer(t)
	long := srv.URL + "/" + strings.Repeat("x", maxLine)
	file := writeFile(t, srv.URL+"/before", long, srv.URL+"/after")
	got := runCmd(context.Background(), t, "", "-urls", file, "-rule", "127.0.0.1=100/1s")
	require.Equal(t, 1, got.code, "stderr: %s", got.stderr)
	res := decodeLines(t, got.stdout)
	require.Len(t, res, 3)
	var bad []result
	for _, r := range res {
		if r.Error != "" {
			bad = append(bad, r)
		}
	}
	require.Len(t, bad, 1)
	require.Equal(t, fmt.Sprintf("line longer than %d bytes: not read", maxLine), bad[0].Error)
	require.True(t, strings.HasPrefix(long, strings.TrimSuffix(bad[0].URL, "…")))
	require.Zero(t, bad[0].Status)
	require.EqualValues(t, 2, hits.Load())
}

func TestCrawlRetries(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1)%3 != 0 { // two failures, then a success
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	defer srv.Close()
	file := writeFile(t, srv.URL+"/flaky")
	tests := []struct {
		name    string
		retries string
		code    int
		want    result
	}{
		{"retried until it works", "3", 0, result{URL: srv.URL + "/flaky", Status: 200, Attempts: 3}},
		{"no retries", "0", 1, result{URL: srv.URL + "/flaky", Status: 503, Attempts: 1, Error: "HTTP 503 Service Unavailable"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n.Store(0)
			got := runCmd(context.Background(), t, "", "-urls", file, "-rule", "127.0.0.1=100/1s", "-retries", tt.retries)
			require.Equal(t, tt.code, got.code, "stderr: %s", got.stderr)
			require.Equal(t, []result{tt.want}, decodeLines(t, got.stdout))
		})
	}
}

func TestCrawlFailuresWithoutResponse(t *testing.T) {
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	}))
	defer slow.Close()
	closed := httptest.NewServer(http.NotFoundHandler())
	closedURL := closed.URL + "/gone"
	closed.Close()

	file := writeFile(t, slow.URL+"/slow", closedURL)
	start := time.Now()
	got := runCmd(context.Background(), t, "", "-urls", file, "-default", "100/1s", "-retries", "0", "-timeout", "200ms")
	require.Less(t, time.Since(start), 3*time.Second, "-timeout bounds each attempt")
	require.Equal(t, 1, got.code, "stderr: %s", got.stderr)
	res := decodeLines(t, got.stdout)
	require.Len(t, res, 2)
	for _, r := range res {
		require.Zero(t, r.Status, r.URL)
		if r.URL == closedURL {
			require.Zero(t, r.Attempts, "a refused dial sends nothing")
		} else {
			require.Equal(t, 1, r.Attempts, r.URL)
		}
		require.NotEmpty(t, r.Error, r.URL)
		require.NotContains(t, r.Error, "Get ", "the URL is not repeated in the error")
		if r.URL == slow.URL+"/slow" {
			require.True(t, strings.HasSuffix(r.Error, "context deadline exceeded (no answer within -timeout 200ms)"), r.Error)
		}
	}
}

// TestCrawlReportsABodyThatStalls: -timeout bounds the body too; the line
// keeps the status and names the flag.
func TestCrawlReportsABodyThatStalls(t *testing.T) {
	stall := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "partial")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	defer stall.Close()
	got := runCmd(context.Background(), t, "", "-urls", writeFile(t, stall.URL+"/stall"), "-default", "100/1s", "-retries", "0", "-timeout", "200ms")
	require.Equal(t, 1, got.code, "stderr: %s", got.stderr)
	require.Equal(t, []result{{URL: stall.URL + "/stall", Status: 200, Attempts: 1,
		Error: "read body: the answer did not end within -timeout 200ms"}}, decodeLines(t, got.stdout))
}

func TestCrawlInterrupted(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select { // slow pages: some are in flight when the run is interrupted
		case <-r.Context().Done():
		case <-time.After(300 * time.Millisecond):
			_, _ = io.WriteString(w, "ok")
		}
	}))
	defer srv.Close()
	const total = 500
	urls := make([]string, total)
	for i := range urls {
		urls[i] = fmt.Sprintf("%s/page/%d", srv.URL, i)
	}
	file := writeFile(t, urls...)

	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(1200*time.Millisecond, cancel)
	start := time.Now()
	got := runCmd(ctx, t, "", "-urls", file, "-rule", "127.0.0.1=5/1s", "-workers", "4")
	require.Less(t, time.Since(start), 3*time.Second, "an interrupted crawl ends promptly")
	require.Equal(t, 1, got.code, "stderr: %s", got.stderr)

	res := decodeLines(t, got.stdout)
	// The URLs read are a prefix of the file; each has exactly one line.
	seen := map[string]int{}
	for _, r := range res {
		seen[r.URL]++
	}
	require.Len(t, seen, len(res), "one line per URL")
	require.Less(t, len(res), total, "reading stopped")
	for i := range len(res) {
		require.Equal(t, 1, seen[urls[i]], "URL %d of the %d read has no line", i, len(res))
	}
	var ok, stopped int
	for _, r := range res {
		switch {
		case r.Status == 200 && r.Error == "":
			ok++
		case r.Error == interrupted:
			require.Zero(t, r.Status)
			stopped++
		default:
			t.Fatalf("unexpected line %+v", r)
		}
	}
	require.Positive(t, ok, "some pages were fetched before the interruption")
	require.Positive(t, stopped, "some pages were read but not fetched")
	require.Contains(t, got.stderr, "the rest of the input was not read")
}

// eofReader is a reader of URLs that closes eof when it reports io.EOF.
type eofReader struct {
	r    io.Reader
	eof  chan struct{}
	once sync.Once
}

func (e *eofReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err == io.EOF {
		e.once.Do(func() { close(e.eof) })
	}
	return n, err
}

// TestCrawlInterruptedAfterTheWholeInput: interrupted once every URL was
// read, the crawl does not say that some of the input was not.
func TestCrawlInterruptedAfterTheWholeInput(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // holds every URL until the interruption
	}))
	defer srv.Close()
	in := &eofReader{r: strings.NewReader(srv.URL + "/a\n" + srv.URL + "/b\n"), eof: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-in.eof
		cancel()
	}()
	var stdout, stderr strings.Builder
	code := run(ctx, []string{"-urls", "-", "-default", "100/1s"}, in, &stdout, &stderr)
	require.Equal(t, 1, code, "stderr: %s", stderr.String())
	require.Len(t, decodeLines(t, stdout.String()), 2)
	require.Contains(t, stderr.String(), "interrupted after reading 2 URLs: each has its line, the whole input was read")
	require.NotContains(t, stderr.String(), "not read")
}

// TestCrawlStopsOnAStalledInput: interrupted while its input stays open
// and silent (a producer piped to -urls - that keeps its end open), the
// crawl stops at once, not when the producer closes the pipe, with a line
// for every URL read.
func TestCrawlStopsOnAStalledInput(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	defer srv.Close()
	pr, pw := io.Pipe()
	defer pw.Close()
	ctx, cancel := context.WithCancel(context.Background())
	var stdout, stderr strings.Builder
	out := &lockedWriter{w: &stdout}
	done := make(chan int)
	go func() { done <- run(ctx, []string{"-urls", "-", "-default", "100/1s"}, pr, out, &stderr) }()
	_, err := io.WriteString(pw, srv.URL+"/a\n")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		out.mu.Lock()
		defer out.mu.Unlock()
		return strings.Contains(stdout.String(), "/a")
	}, 10*time.Second, 5*time.Millisecond, "the first URL's line")
	cancel() // the pipe stays open, and nothing more comes
	select {
	case code := <-done:
		require.Equal(t, 1, code, "stderr: %s", stderr.String())
	case <-time.After(10 * time.Second):
		t.Fatal("the crawl waited for its stalled input")
	}
	require.Equal(t, []result{{URL: srv.URL + "/a", Status: 200, Attempts: 1}}, decodeLines(t, stdout.String()))
	require.Contains(t, stderr.String(), "interrupted after reading 1 URL")
}

func TestReadLines(t *testing.T) {
	type line struct {
		s       string
		tooLong bool
	}
	tests := []struct {
		name string
		in   string
		max  int
		want []line
	}{
		{"empty", "", 10, nil},
		{"no final newline", "a\nb", 10, []line{{"a", false}, {"b", false}}},
		{"crlf", "a\r\nb\r\n", 10, []line{{"a", false}, {"b", false}}},
		{"blank lines kept", "a\n\nb\n", 10, []line{{"a", false}, {"", false}, {"b", false}}},
		{"too long in the middle", "ok\n0123456789abc\nok2\n", 8, []line{{"ok", false}, {"01234567", true}, {"ok2", false}}},
		{"too long at the end", "0123456789abc", 8, []line{{"01234567", true}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []line
			err := readLines(strings.NewReader(tt.in), tt.max, func(s string, tooLong bool) {
				got = append(got, line{s, tooLong})
			}, func() bool { return true })
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

// TestCheckURLSaysWhy: a line that is not a URL is told why, in words that
// quote nothing of it (the part that failed may be a password; each
// reason secret.URLError gives is tested there).
func TestCheckURLSaysWhy(t *testing.T) {
	for line, want := range map[string]string{
		"http://u:s3cr/3t@host/": "not a URL: a port that is not a number",
		"a:b/c":                  "scheme \"a\": want http or https",
	} {
		_, err := checkURL(line)
		require.EqualError(t, err, want, line)
	}
}

// TestReadLinesDropsAByteOrderMark: a URL file saved with a UTF-8 byte
// order mark starts with a URL, not with an invisible character.
func TestReadLinesDropsAByteOrderMark(t *testing.T) {
	var got []string
	err := readLines(strings.NewReader("\ufeffhttp://a.example/\n\ufeffhttp://b.example/\n"), 100,
		func(s string, _ bool) { got = append(got, s) }, func() bool { return true })
	require.NoError(t, err)
	require.Equal(t, []string{"http://a.example/", "\ufeffhttp://b.example/"}, got, "only the file's first bytes are a mark")
}

func TestReadLinesLongerThanTheBuffer(t *testing.T) {
	long := strings.Repeat("y", 200<<10) // longer than the 64 KiB reader buffer, shorter than max
	var got []string
	err := readLines(strings.NewReader("a\n"+long+"\nb\n"), maxLine, func(s string, tooLong bool) {
		require.False(t, tooLong)
		got = append(got, s)
	}, func() bool { return true })
	require.NoError(t, err)
	require.Equal(t, []string{"a", long, "b"}, got)
}

func TestReadLinesStopsWhenAsked(t *testing.T) {
	var got []string
	err := readLines(strings.NewReader("a\nb\nc\n"), 10, func(s string, _ bool) { got = append(got, s) },
		func() bool { return len(got) < 2 })
	require.NoError(t, err)
	require.Equal(t, []string{"a", "b"}, got)
}

func TestCrawlWhenTheStoreFails(t *testing.T) {
	srv, _ := countingServer(t)
	t.Run("store down from the start, policy open", func(t *testing.T) {
		file, _ := urlFile(t, srv.URL, "open", 5)
		// Nothing listens on port 1: every store call fails.
		got := runCmd(context.Background(), t, "", "-urls", file, "-rule", "127.0.0.1=100/1s",
			"-redis", "redis://127.0.0.1:1/0", "-on-store-error", "open")
		require.Equal(t, 0, got.code, "stderr: %s", got.stderr)
		require.Len(t, decodeLines(t, got.stdout), 5)
		require.Contains(t, got.stderr, "redis does not answer")
		require.Contains(t, got.stderr, "store failed; deciding by the failure policy")
		require.Contains(t, got.stderr, "policy=open")
		require.NotContains(t, got.stderr, "go-redis:", "go-redis's own lines only with -v")
	})
	t.Run("store down from the start, policy local", func(t *testing.T) {
		file, _ := urlFile(t, srv.URL, "local-down", 5)
		got := runCmd(context.Background(), t, "", "-urls", file, "-rule", "127.0.0.1=100/1s",
			"-redis", "redis://:s3cret@127.0.0.1:1/0")
		require.Equal(t, 2, got.code, "stderr: %s", got.stderr)
		require.Contains(t, got.stderr, "-redis redis://***@127.0.0.1:1/0 does not answer as a master")
		require.NotContains(t, got.stderr, "s3cret")
		require.Empty(t, got.stdout, "nothing is fetched")
	})
	t.Run("store dies mid-run, policy local", func(t *testing.T) {
		rdb := redistest.StartServer(t)
		file, _ := urlFile(t, srv.URL, "local", 30)
		done := make(chan outcome, 1)
		go func() {
			var stdout, stderr strings.Builder
			code := run(context.Background(), []string{"-urls", file, "-rule", "127.0.0.1=10/1s", "-redis", rdb.URL()},
				strings.NewReader(""), &stdout, &stderr)
			done <- outcome{code: code, stdout: stdout.String(), stderr: stderr.String()}
		}()
		time.Sleep(700 * time.Millisecond) // a few windows' worth decided by the store
		rdb.Kill(t)
		got := <-done
		require.Equal(t, 0, got.code, "stderr: %s", got.stderr)
		require.Len(t, decodeLines(t, got.stdout), 30)
		require.Contains(t, got.stderr, "store failed; deciding by the failure policy")
		require.Contains(t, got.stderr, "policy=local")
	})
}

func TestCrawlOnACluster(t *testing.T) {
	cluster := redistest.StartCluster(t)
	site := fakesite.New(fakesite.Config{})
	srv := httptest.NewServer(site)
	defer srv.Close()
	file, urls := urlFile(t, srv.URL, "c", 12)
	// A store timeout well above the default: under -race beside other
	// packages' tests a cluster call passed 30 ms, and this test is about
	// routing, not the timeout.
	got := runCmd(context.Background(), t, "", "-urls", file, "-rule", "127.0.0.1=5/500ms", "-margin", "50ms", "-store-timeout", "500ms", "-redis", cluster.URL())
	require.Equal(t, 0, got.code, "stderr: %s", got.stderr)
	require.Len(t, decodeLines(t, got.stdout), len(urls))
	require.NotContains(t, got.stderr, "store failed", "the cluster answered every call")
	require.LessOrEqual(t, fakesite.Peak(site.Stats().Arrivals, 500*time.Millisecond), 5)
}

// TestCrawlWithListLogs: -redis-list-logs keeps the target's log in a list
// and its meta in the 32-byte form of releases before short logs moved
// into meta, and the limit holds.
func TestCrawlWithListLogs(t *testing.T) {
	rdb := redistest.StartServer(t)
	site := fakesite.New(fakesite.Config{})
	srv := httptest.NewServer(site)
	defer srv.Close()
	file, urls := urlFile(t, srv.URL, "l", 8)
	got := runCmd(context.Background(), t, "", "-urls", file, "-rule", "127.0.0.1=5/500ms", "-margin", "50ms", "-redis", rdb.URL(), "-redis-list-logs")
	require.Equal(t, 0, got.code, "stderr: %s", got.stderr)
	require.Len(t, decodeLines(t, got.stdout), len(urls))
	require.LessOrEqual(t, fakesite.Peak(site.Stats().Arrivals, 500*time.Millisecond), 5)
	ctx := context.Background()
	c := rdb.Client(t)
	n, err := c.LLen(ctx, throttle.DefaultKeyPrefix+"{127.0.0.1}:log").Result()
	require.NoError(t, err)
	require.Positive(t, n, "the log is a list")
	meta, err := c.Get(ctx, throttle.DefaultKeyPrefix+"{127.0.0.1}:pause").Result()
	require.NoError(t, err)
	require.Len(t, meta, 32, "meta as releases before short logs in meta wrote it")
}

// TestCrawlThroughSentinel: a -redis URL with master_name finds the master
// through a Sentinel. When the master dies mid-crawl the Sentinel promotes
// its replica; the crawl goes on through the fallback and comes back to the
// store on the new master, and the site never sees more than the rule.
func TestCrawlThroughSentinel(t *testing.T) {
	master := redistest.StartServer(t)
	replica := redistest.StartServer(t, "--replicaof", "127.0.0.1", strings.TrimPrefix(master.Addr, "127.0.0.1:"))
	sentinel := redistest.StartSentinel(t, master, "fleet")
	site := fakesite.New(fakesite.Config{})
	srv := httptest.NewServer(site)
	defer srv.Close()
	file, urls := urlFile(t, srv.URL, "s", 60) // 6 s: the failover takes 2-3
	done := make(chan outcome, 1)
	go func() {
		var stdout, stderr strings.Builder
		code := run(context.Background(), []string{"-urls", file, "-rule", "127.0.0.1=10/1s",
			"-redis", "redis://" + sentinel.Addr + "?master_name=fleet"}, strings.NewReader(""), &stdout, &stderr)
		done <- outcome{code: code, stdout: stdout.String(), stderr: stderr.String()}
	}()
	time.Sleep(time.Second) // some of the crawl decided on the first master
	master.Kill(t)
	got := <-done
	require.Equal(t, 0, got.code, "stderr: %s", got.stderr)
	require.Len(t, decodeLines(t, got.stdout), len(urls))
	require.Contains(t, got.stderr, "store failed; deciding by the failure policy")
	require.Contains(t, got.stderr, "store is back; deciding by the store again", "the promoted replica took over")
	role, err := replica.Client(t).Do(context.Background(), "ROLE").Slice()
	require.NoError(t, err)
	require.Equal(t, "master", role[0], "the Sentinel promoted the replica")
	require.LessOrEqual(t, fakesite.Peak(site.Stats().Arrivals, time.Second), 10)
}

// TestStoreTimeoutFlag: a store call that takes longer than the store
// timeout hands the decision to the failure policy; -store-timeout gives a
// slow (distant) Redis the time it needs.
func TestStoreTimeoutFlag(t *testing.T) {
	rdb := redistest.StartServer(t)
	srv, _ := countingServer(t)
	file, urls := urlFile(t, srv.URL, "st", 3)
	for _, tt := range []struct {
		name       string
		args       []string
		storeFails bool
	}{
		{"default", nil, true},
		{"raised", []string{"-store-timeout", "5s"}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// Script runs (writes) wait 700 ms; the start-up probe (ROLE) does not.
			require.NoError(t, rdb.Client(t).Do(context.Background(), "CLIENT", "PAUSE", "700", "WRITE").Err())
			args := append([]string{"-urls", file, "-rule", "127.0.0.1=100/1s", "-redis", rdb.URL()}, tt.args...)
			got := runCmd(context.Background(), t, "", args...)
			require.Equal(t, 0, got.code, "stderr: %s", got.stderr)
			require.Len(t, decodeLines(t, got.stdout), len(urls))
			require.Equal(t, tt.storeFails, strings.Contains(got.stderr, "store failed"), "stderr: %s", got.stderr)
		})
	}
}

// TestCrawlRefusesAStoreThatTakesNoWrites: a replica or a Sentinel answers
// PING but fails every script run; a crawl pointed at one must stop at the
// start with a message, not wait forever for a store that never decides.
func TestCrawlRefusesAStoreThatTakesNoWrites(t *testing.T) {
	master := redistest.StartServer(t)
	replica := redistest.StartServer(t, "--replicaof", "127.0.0.1", strings.TrimPrefix(master.Addr, "127.0.0.1:"))
	sentinel := redistest.StartSentinel(t, master, "fleet")
	srv, hits := countingServer(t)
	file, _ := urlFile(t, srv.URL, "r", 3)
	for _, tt := range []struct{ name, url, want string }{
		{"replica", replica.URL(), "is a slave, not a master"},
		{"sentinel", "redis://" + sentinel.Addr, "is a sentinel, not a master"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := runCmd(context.Background(), t, "", "-urls", file, "-default", "10/1s", "-redis", tt.url)
			require.Equal(t, 2, got.code, "stderr: %s", got.stderr)
			require.Contains(t, got.stderr, "does not answer")
			require.Contains(t, got.stderr, tt.want)
			require.Empty(t, got.stdout)
		})
	}
	require.Zero(t, hits.Load(), "nothing is fetched")
}

// TestCrawlNeverShowsTheRedisPassword: a Redis that does not know AUTH
// quotes the connection's AUTH, password and all, in its error; neither the
// message that stops the crawl nor the log lines of one that goes on
// without the store show it.
func TestCrawlNeverShowsTheRedisPassword(t *testing.T) {
	const password = "Sup3rS3cret-cli"
	rdb := redistest.StartServer(t, "--rename-command", "AUTH", "", "--rename-command", "HELLO", "")
	url := "redis://admin:" + password + "@" + rdb.Addr + "/0"
	srv, hits := countingServer(t)
	file, urls := urlFile(t, srv.URL, "pw", 2)

	got := runCmd(context.Background(), t, "", "-urls", file, "-default", "10/1s", "-redis", url)
	require.Equal(t, 2, got.code, "stderr: %s", got.stderr)
	require.Contains(t, got.stderr, "unknown command 'auth'", "the server's own words are kept")
	require.NotContains(t, got.stderr, password)
	require.Zero(t, hits.Load())

	got = runCmd(context.Background(), t, "", "-urls", file, "-default", "10/1s", "-redis", url, "-on-store-error", "open", "-v")
	require.Equal(t, 0, got.code, "stderr: %s", got.stderr)
	require.Len(t, decodeLines(t, got.stdout), len(urls))
	require.Contains(t, got.stderr, "store failed", "the store's failure is logged")
	require.NotContains(t, got.stderr, password)
	require.NotContains(t, got.stdout, password)
}

// TestCrawlNeverShowsAURLsPassword: a password in a URL is shown as
// "xxxxx" in its output line, its error and the debug log, whether the
// fetch works or not.
func TestCrawlNeverShowsAURLsPassword(t *testing.T) {
	srv, _ := countingServer(t)
	ok := strings.Replace(srv.URL, "http://", "http://alice:s3cret@", 1) + "/ok"
	token := strings.Replace(srv.URL, "http://", "http://T0kenLeak99@", 1) + "/token" // a user alone: a token
	down := "http://bob:hunter2@127.0.0.1:1/down"                                     // nothing listens on port 1
	downToken := "http://T0kenLeak98@127.0.0.1:1/down"
	downNested := "http://127.0.0.1:1/r?next=http://v:NestedLeak97@g/" // a password in the query
	// Lines that do not parse as URLs: a space in the host, a bad escape
	// in the password.
	spaced, escaped := "http://carol:PwLeak77@a b.com/x", "http://dave:Pw%zzLeak88@example.com/"
	got := runCmd(context.Background(), t, "", "-urls", writeFile(t, ok, token, down, downToken, downNested, spaced, escaped), "-default", "100/1s", "-retries", "1", "-v")
	require.Equal(t, 1, got.code, "stderr: %s", got.stderr)
	for _, secret := range []string{"s3cret", "T0kenLeak99", "T0kenLeak98", "NestedLeak97", "hunter2", "PwLeak77", "Leak88"} {
		require.NotContains(t, got.stdout, secret)
		require.NotContains(t, got.stderr, secret)
	}
	lines := decodeLines(t, got.stdout)
	require.Len(t, lines, 7)
	byURL := map[string]result{}
	for _, r := range lines {
		byURL[r.URL] = r
	}
	require.Equal(t, 200, byURL[strings.Replace(ok, "s3cret", "xxxxx", 1)].Status, "%+v", lines)
	require.Equal(t, 200, byURL[strings.Replace(token, "T0kenLeak99", "xxxxx", 1)].Status, "%+v", lines)
	require.NotEmpty(t, byURL["http://xxxxx@127.0.0.1:1/down"].Error, "%+v", lines)
	require.Contains(t, got.stderr, "url=http://xxxxx@127.0.0.1:1/down", "-v names each failed attempt's URL")
	failed := byURL[strings.Replace(down, "hunter2", "xxxxx", 1)]
	require.NotEmpty(t, failed.Error, "%+v", lines)
	require.Equal(t, "not a URL: a character a host name cannot hold", byURL["http://carol:xxxxx@a b.com/x"].Error, "%+v", lines)
	require.Equal(t, "not a URL: a '%' not followed by two hexadecimal digits", byURL["http://dave:xxxxx@example.com/"].Error, "%+v", lines)
}

func TestHidePassword(t *testing.T) {
	for raw, want := range map[string]string{
		"http://u:pw@example.com/x":                                 "http://u:xxxxx@example.com/x",
		"http://u@example.com/x":                                    "http://xxxxx@example.com/x",
		"http://T0KEN@a b.com/x":                                    "http://xxxxx@a b.com/x",
		"https://T0KEN@example.com:8443/@bob%zz":                    "https://xxxxx@bob%zz",
		"https://T0KEN@a b.com/x:y@z":                               "https://xxxxx@z",
		"T0KEN@example.com/x":                                       "xxxxx@example.com/x",
		"example.com/x":                                             "example.com/x",
		"http://h/r?to=http://T0KEN@g/x":                            "http://h/r?to=http://xxxxx@g/x",
		"http://u:p@w@a b.com/x":                                    "http://u:xxxxx@a b.com/x",
		"u:pw@example.com/x":                                        "u:xxxxx@example.com/x",
		"http://example.com:80/a@b":                                 "http://example.com:80/a@b",
		"http://[::1:80/x":                                          "http://[::1:80/x",
		"http://u:Pw#Leak@a b.com/":                                 "http://u:xxxxx@a b.com/",
		"http://u:Pw/Leak@a b.com/":                                 "http://u:xxxxx@a b.com/",
		"http://u:Pw?Leak@a b.com/":                                 "http://u:xxxxx@a b.com/",
		"https://h%zz/p?q=a:b@c":                                    "https://h%zz/p?q=a:xxxxx@c", // more than the password, never less
		"http://u:Pw%zz@host:8080/p@q:r@":                           "http://u:xxxxx@",
		"http://u:pw@h/r?to=http://v:Other@g/x&b=https://w:Third@k": "http://u:xxxxx@h/r?to=http://v:xxxxx@g/x&b=https://w:xxxxx@k",
		"http://h/r?to=http%3A%2F%2Fv%3Apw2%40host%2F&b=https%3a%2f%2fw%3aThird%40k": "http://h/r?to=http%3A%2F%2Fv%3Axxxxx%40host%2F&b=https%3a%2f%2fw%3axxxxx%40k",
		"http://h/r?to=http%3A%2F%2Fv%40host%2Fa%3Ab%40c":                            "http://h/r?to=http%3A%2F%2Fxxxxx%40host%2Fa%3Ab%40c",
		"http://h/r?to=http%3A%2F%2Fhost%2Fa%3Ab%40c":                                "http://h/r?to=http%3A%2F%2Fhost%2Fa%3Ab%40c",
		"https://h/\xff\xff?next=https%3A%2F%2Fu%3Asecret%40h2%2F":                   "https://h/\xff\xff?next=https%3A%2F%2Fu%3Axxxxx%40h2%2F",
		"https://h/ȺȺȺ?n=https%3A%2F%2Fu%3Asecret%40h2":                              "https://h/ȺȺȺ?n=https%3A%2F%2Fu%3Axxxxx%40h2",
		"https://h/İİİİ?n=https%3A%2F%2Fu%3Asecret%40h2":                             "https://h/İİİİ?n=https%3A%2F%2Fu%3Axxxxx%40h2",
		"\xff\xff\xff\xff%3A%2F%2F":                                                  "\xff\xff\xff\xff%3A%2F%2F",
		"http://h/r?to=http://v@g/x:y@z":                                             "http://h/r?to=http://xxxxx@g/x:y@z",
		"http://h/r?to=http://g/x:y@z":                                               "http://h/r?to=http://g/x:y@z",
	} {
		require.Equal(t, want, hidePassword(raw), raw)
	}
}

// TestAHeldBackHostDoesNotStallTheOthers: a host that answers 429 with a
// long Retry-After holds the workers on it for that long; it gets half
// of them at most while other hosts' URLs wait, so those go at once.
func TestAHeldBackHostDoesNotStallTheOthers(t *testing.T) {
	var mu sync.Mutex
	var otherAt []time.Duration
	start := time.Now()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.Host, "127.0.0.1") {
			w.Header().Set("Retry-After", "2")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		mu.Lock()
		otherAt = append(otherAt, time.Since(start))
		mu.Unlock()
	}))
	defer srv.Close()
	other := strings.Replace(srv.URL, "127.0.0.1", "localhost", 1)
	var lines []string
	for i := range 8 { // as many as the workers, first in the file
		lines = append(lines, fmt.Sprintf("%s/held/%d", srv.URL, i))
	}
	for i := range 3 {
		lines = append(lines, fmt.Sprintf("%s/other/%d", other, i))
	}
	got := runCmd(context.Background(), t, "", "-urls", writeFile(t, lines...), "-default", "100/1s", "-workers", "8", "-retries", "1")
	require.Equal(t, 1, got.code, "the held host's URLs fail; stderr: %s", got.stderr)
	require.Len(t, decodeLines(t, got.stdout), len(lines))
	require.GreaterOrEqual(t, time.Since(start), 2*time.Second, "the held host's retries waited out its Retry-After")
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, otherAt, 3)
	for _, at := range otherAt {
		require.Less(t, at, time.Second, "the other host's URLs went without waiting for the held one: %v", otherAt)
	}
}

// A body longer than the crawler reads is not a success: its line says it
// was not read to the end. One of exactly that length still is.
func TestCrawlReportsABodyTooLongToRead(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := maxBody
		if r.URL.Path == "/long" {
			n++
		}
		w.Header().Set("Content-Length", strconv.Itoa(n))
		_, _ = io.CopyN(w, zeros{}, int64(n))
	}))
	defer srv.Close()
	file := writeFile(t, srv.URL+"/fits", srv.URL+"/long")
	got := runCmd(context.Background(), t, "", "-urls", file, "-default", "100/1s")
	require.Equal(t, 1, got.code, "stderr: %s", got.stderr)
	res := decodeLines(t, got.stdout)
	slices.SortFunc(res, func(a, b result) int { return strings.Compare(a.URL, b.URL) })
	require.Equal(t, []result{
		{URL: srv.URL + "/fits", Status: 200, Attempts: 1},
		{URL: srv.URL + "/long", Status: 200, Attempts: 1, Error: "read body: longer than 32 MiB, the rest not read"},
	}, res)
}

// A line whose URL is not UTF-8 names it as it was sent, its other bytes
// percent-encoded, not as JSON would mangle it.
func TestCrawlNamesANonUTF8URLAsSent(t *testing.T) {
	var path atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		path.Store(r.URL.EscapedPath())
	}))
	defer srv.Close()
	file := writeFile(t, srv.URL+"/inv\xff\xfe")
	got := runCmd(context.Background(), t, "", "-urls", file, "-default", "100/1s")
	require.Equal(t, 0, got.code, "stderr: %s", got.stderr)
	require.Equal(t, "/inv%FF%FE", path.Load())
	require.Equal(t, []result{{URL: srv.URL + "/inv%FF%FE", Status: 200, Attempts: 1}}, decodeLines(t, got.stdout))
}

// A request net/http sends again on another connection, after a reused
// one was reset, counts among its line's attempts: the line says how many
// requests the target got.
func TestCrawlCountsTheRequestsNetHTTPSendsAgain(t *testing.T) {
	var resets atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/reset" {
			return
		}
		resets.Add(1)
		conn, _, err := w.(http.Hijacker).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		_ = conn.(*net.TCPConn).SetLinger(0) // close with RST
		_ = conn.Close()
	}))
	defer srv.Close()
	file := writeFile(t, srv.URL+"/ok", srv.URL+"/reset") // one worker: /reset goes on /ok's connection
	got := runCmd(context.Background(), t, "", "-urls", file, "-default", "100/1s", "-workers", "1", "-retries", "0")
	require.Equal(t, 1, got.code, "stderr: %s", got.stderr)
	res := decodeLines(t, got.stdout)
	require.Len(t, res, 2)
	require.Equal(t, result{URL: srv.URL + "/ok", Status: 200, Attempts: 1}, res[0])
	require.Equal(t, srv.URL+"/reset", res[1].URL)
	require.EqualValues(t, 2, resets.Load(), "the reset request and net/http's second try on a new connection")
	require.Equal(t, int(resets.Load()), res[1].Attempts, "attempts on the line: %+v", res[1])
}

// zeros reads as an endless run of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// TestABadCommandLineLeavesTheOutputFile: rules that conflict, or a store
// that does not answer, stop the crawl before it creates -out, so a mistyped
// rerun does not wipe an earlier run's results.
func TestABadCommandLineLeavesTheOutputFile(t *testing.T) {
	srv, hits := countingServer(t)
	file, _ := urlFile(t, srv.URL, "keep", 2)
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"rules that conflict", []string{"-rule", "a.com=1/1s", "-rule", "a.com=2/1s"}, "a.com"},
		{"a store that does not answer", []string{"-redis", "redis://127.0.0.1:1/0"}, "does not answer"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "results.jsonl")
			require.NoError(t, os.WriteFile(out, []byte("an earlier run's line\n"), 0o644))
			got := runCmd(context.Background(), t, "", append([]string{"-urls", file, "-out", out}, tt.args...)...)
			require.Equal(t, 2, got.code, "stderr: %s", got.stderr)
			require.Contains(t, got.stderr, tt.want)
			kept, err := os.ReadFile(out)
			require.NoError(t, err)
			require.Equal(t, "an earlier run's line\n", string(kept))
		})
	}
	require.Zero(t, hits.Load(), "nothing is fetched")
}

// TestAnOutputFileOnStdinIsRefused: crawl-demo -urls - -out FILE < FILE
// is refused, as -urls FILE -out FILE is, before FILE is truncated.
func TestAnOutputFileOnStdinIsRefused(t *testing.T) {
	srv, hits := countingServer(t)
	file := writeFile(t, srv.URL+"/a")
	stdin, err := os.Open(file)
	require.NoError(t, err)
	defer stdin.Close()
	var stdout, stderr strings.Builder
	code := run(context.Background(), []string{"-urls", "-", "-out", file}, stdin, &stdout, &stderr)
	require.Equal(t, 2, code, "stderr: %s", stderr.String())
	require.Contains(t, stderr.String(), "-out "+file+": is the file stdin reads (-urls -), which it would overwrite")
	kept, err := os.ReadFile(file)
	require.NoError(t, err)
	require.Equal(t, srv.URL+"/a\n", string(kept))
	require.Zero(t, hits.Load(), "nothing is fetched")
}

// TestCrawlNeverShowsARedirectsPassword: a redirect whose Location does
// not parse fails its URL with net/http's error, which quotes the
// Location, and url.Parse's, which quotes the part that failed; the line
// shows neither the password nor a part of it.
func TestCrawlNeverShowsARedirectsPassword(t *testing.T) {
	locations := map[string]string{ // path: Location
		"/escape": "http://u:PwLeak1@%zz/",
		"/slash":  "http://u:Pw/Leak2@h/",
		"/inpw":   "http://u:Pw%zzLeak3@h/",
		"/quote":  `http://u:Pw"Leak4@%zz/`,
		"/space":  "http://u:Pw Leak5@h/",
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header()["Location"] = []string{locations[r.URL.Path]}
		w.WriteHeader(http.StatusFound)
	}))
	defer srv.Close()
	var urls []string
	for _, path := range slices.Sorted(maps.Keys(locations)) {
		urls = append(urls, srv.URL+path)
	}
	got := runCmd(context.Background(), t, "", "-urls", writeFile(t, urls...), "-default", "100/1s", "-retries", "0", "-v")
	require.Equal(t, 1, got.code, "stderr: %s", got.stderr)
	for _, secret := range []string{"PwLeak1", "Leak2", "Pw/", "Leak3", "Pw%zz", "Leak4", "Leak5"} {
		require.NotContains(t, got.stdout, secret)
		require.NotContains(t, got.stderr, secret)
	}
	lines := decodeLines(t, got.stdout)
	require.Len(t, lines, len(locations))
	byURL := map[string]string{}
	for _, r := range lines {
		byURL[r.URL] = r.Error
	}
	require.Equal(t, `failed to parse Location header "http://u:xxxxx@%zz/": a '%' not followed by two hexadecimal digits`, byURL[srv.URL+"/escape"])
	require.Equal(t, `failed to parse Location header "http://u:xxxxx@h/": a port that is not a number`, byURL[srv.URL+"/slash"])
}

func TestHideErrorPasswords(t *testing.T) {
	for msg, want := range map[string]string{
		"":                                       "",
		"dial tcp 127.0.0.1:1: connect: refused": "dial tcp 127.0.0.1:1: connect: refused",
		`Get "http://u:pw@h/": EOF`:              `Get "http://u:xxxxx@h/": EOF`,
		"Get http://u:pw@h/: EOF":                "Get http://u:xxxxx@h/: EOF",
		`a "http://u:p\"w@%zz/" b "http://v:q@h"`:       `a "http://u:xxxxx@%zz/" b "http://v:xxxxx@h"`,
		`"http://u:p w@h/" and "u:p@h"`:                 `"http://u:xxxxx@h/" and "u:p@h"`,
		`"http://h/?next=http%3A%2F%2Fu%3Apw%40g"`:      `"http://h/?next=http%3A%2F%2Fu%3Axxxxx%40g"`,
		`unclosed "http://u:pw@h/ here`:                 `unclosed "http://u:xxxxx@h/ here`,
		"user@host:1 and http://u@h/":                   "user@host:1 and http://xxxxx@h/", // a user alone in a URL: a token
		"Get http://sk_Leak1:@h/: EOF":                  "Get http://xxxxx@h/: EOF",        // a token with an empty password
		"Get http://sk_Leak2:@%zz/: EOF":                "Get http://xxxxx@%zz/: EOF",      // so, in a line that does not parse
		`"http://h/?next=http%3A%2F%2Fsk_Leak3%3A%40g"`: `"http://h/?next=http%3A%2F%2Fxxxxx%40g"`,
		`"http://h/?next=http://sk_Leak4:@g/"`:          `"http://h/?next=http://xxxxx@g/"`, // nested
	} {
		require.Equal(t, want, hideErrorPasswords(msg), msg)
	}
}

// TestCrawlSaysWhenTheTargetPausesTheFleet: a 429 with Retry-After holds
// every worker on the target; without -v the log says so, so that a long
// pause does not look like a hang.
func TestCrawlSaysWhenTheTargetPausesTheFleet(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			w.Header().Set("Retry-After", "1")
			http.Error(w, "slow down", http.StatusTooManyRequests)
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	defer srv.Close()
	got := runCmd(context.Background(), t, "", "-urls", writeFile(t, srv.URL+"/a"), "-rule", "127.0.0.1=100/1s")
	require.Equal(t, 0, got.code, "stderr: %s", got.stderr)
	require.Equal(t, []result{{URL: srv.URL + "/a", Status: 200, Attempts: 2}}, decodeLines(t, got.stdout))
	require.Contains(t, got.stderr, `level=INFO msg="fleetgate: the target is paused for the whole fleet: requests to it wait until the pause ends" target=127.0.0.1 held=1s set_by="this process"`)
	require.Equal(t, 1, strings.Count(got.stderr, "paused for the whole fleet"), "once: %s", got.stderr)
	require.NotContains(t, got.stderr, "level=DEBUG", "-v is off")
}

// TestLogsNameTheQuotasTarget: two URLs on two ports of one host count
// against one quota, the host's, and the log names that target for both,
// with each URL (or its host:port) beside it, so that a pause heard on one
// port is seen to hold the other.
func TestLogsNameTheQuotasTarget(t *testing.T) {
	busy := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "0") // no pause: the test stays short
		http.Error(w, "slow down", http.StatusTooManyRequests)
	})
	a, b := httptest.NewServer(busy), httptest.NewServer(busy)
	defer a.Close()
	defer b.Close()
	got := runCmd(context.Background(), t, "", "-urls", writeFile(t, a.URL+"/x", b.URL+"/y"), "-rule", "127.0.0.1=100/1s", "-retries", "1", "-v")
	require.Equal(t, 1, got.code, "stderr: %s", got.stderr)
	lines := strings.Split(got.stderr, "\n")
	for _, srv := range []*httptest.Server{a, b} {
		addr := strings.TrimPrefix(srv.URL, "http://")
		var attempts, retries int
		for _, line := range lines {
			switch {
			case strings.Contains(line, `msg=attempt `) && strings.Contains(line, "url="+srv.URL+"/"):
				attempts++
				require.Contains(t, line, " target=127.0.0.1 url="+srv.URL+"/", "an attempt's line names the target, then the URL")
			case strings.Contains(line, "retrying") && strings.Contains(line, "host="+addr+" "):
				retries++
				require.Contains(t, line, " target=127.0.0.1 host="+addr+" ", "the transport's line names the target before the URL's host:port")
			}
		}
		require.Equal(t, 2, attempts, "%s: an attempt line per attempt; stderr:\n%s", srv.URL, got.stderr)
		require.Equal(t, 1, retries, "%s: a retry line; stderr:\n%s", srv.URL, got.stderr)
	}
}
