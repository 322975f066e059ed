package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetgate/fleetgate/throttle"
)

// maxLine bounds a line of the URL file, its line break included. A longer
// line gets an error line and the crawl goes on.
const maxLine = 1 << 20

// shownPrefix is how much of an over-long line its error line quotes.
const shownPrefix = 200

// runCrawl is the crawler (-urls): it fetches every URL of the file through
// the fleet-wide throttle and writes one line per URL. It returns the exit
// status. The rules and the store are checked before the output file is
// created: a mistake on the command line leaves an earlier run's results
// as they were.
func runCrawl(ctx context.Context, cfg *config, stdin io.Reader, stdout, stderr io.Writer, log *slog.Logger) int {
	thr, closeThr, err := crawlThrottler(ctx, cfg, log)
	if err != nil {
		fmt.Fprintf(stderr, "crawl-demo: %v\n", err)
		return 2
	}
	defer closeThr()
	in, out, closeFiles, err := openFiles(cfg, stdin, stdout)
	if err != nil {
		fmt.Fprintf(stderr, "crawl-demo: %v\n", err)
		return 2
	}
	code := crawlFiles(ctx, cfg, thr, in, out, stderr, log)
	if err := closeFiles(); err != nil {
		fmt.Fprintf(stderr, "crawl-demo: %v\n", err)
		return max(code, 1)
	}
	return code
}

// crawlThrottler sets up the throttle of the command line's rules, on its
// store (checked to answer), and returns what closes both.
func crawlThrottler(ctx context.Context, cfg *config, log *slog.Logger) (*throttle.Throttler, func(), error) {
	rules, err := cfg.throttleRules()
	if err != nil {
		return nil, nil, err
	}
	var rdb redis.UniversalClient
	if cfg.redis != nil {
		rdb = cfg.redis.client()
		if err := checkRedis(ctx, cfg.redis, rdb, throttle.FailurePolicy(cfg.policy), log); err != nil {
			rdb.Close()
			return nil, nil, err
		}
	}
	thr, closeThr, err := newThrottler(cfg, rules, rdb, log)
	if err != nil {
		if rdb != nil {
			rdb.Close()
		}
		return nil, nil, err
	}
	if rdb == nil {
		return thr, closeThr, nil
	}
	return thr, func() { closeThr(); rdb.Close() }, nil
}

// quotaOf returns the crawl's group: a URL's host maps to the target of
// the quota it counts against (thr.Target: by -key host, the host as
// throttle.Normalize gives it; by -key domain, its registrable domain), so
// the hosts that share one quota share one host's part of the workers
// rather than each taking half of them while they wait on it. By -key ip
// a host stays itself: its target needs a DNS lookup, which would hold up
// the reading of the URLs behind it.
func quotaOf(ctx context.Context, cfg *config, thr *throttle.Throttler) func(host string) string {
	if throttle.KeyMode(cfg.keyMode) == throttle.ByIP {
		return func(host string) string { return host }
	}
	return func(host string) string {
		if name, ok := targetOf(ctx, thr, host); ok {
			return name
		}
		return host
	}
}

// crawlFiles crawls from in to out through thr and returns the exit status.
func crawlFiles(ctx context.Context, cfg *config, thr *throttle.Throttler, in io.Reader, out io.Writer, stderr io.Writer, log *slog.Logger) int {
	client := newFleetClient(cfg, thr, log, nil)
	defer client.close()

	start := time.Now()
	sum, err := crawl(ctx, in, cfg.workers, quotaOf(ctx, cfg, thr), func(ctx context.Context, u string) result { return fetch(ctx, client, u) }, newLineWriter(out).write)
	log.Info("crawl finished", "urls", sum.urls, "ok", sum.ok, "failed", sum.failed, "interrupted", sum.interrupted,
		"elapsed", time.Since(start).Round(time.Millisecond))
	if err != nil {
		fmt.Fprintf(stderr, "crawl-demo: %v\n", err)
		return 1
	}
	if ctx.Err() != nil {
		rest := "the rest of the input was not read"
		if sum.inputEnded {
			rest = "the whole input was read"
		}
		urls := "URLs"
		if sum.urls == 1 {
			urls = "URL"
		}
		fmt.Fprintf(stderr, "crawl-demo: interrupted after reading %d %s: each has its line, %s\n", sum.urls, urls, rest)
		return 1
	}
	if sum.urls != sum.ok {
		return 1
	}
	return 0
}

// openFiles opens the URL file (stdin for "-") and creates the output file
// (stdout for "" and "-"). It refuses an output file that is the file of
// URLs, named by -urls or redirected to stdin, before creating it, so the
// URLs are never truncated. closeFiles closes what it opened; its error
// says that the output may be incomplete.
func openFiles(cfg *config, stdin io.Reader, stdout io.Writer) (in io.Reader, out io.Writer, closeFiles func() error, err error) {
	in, out = stdin, stdout
	var inFile, outFile *os.File
	var inInfo os.FileInfo // the URL file's, if it is a file; nil if unknown
	if cfg.urls != "-" {
		if inFile, err = os.Open(cfg.urls); err != nil {
			return nil, nil, nil, fmt.Errorf("-urls: %w", err)
		}
		fi, err := inFile.Stat()
		if err == nil && fi.IsDir() {
			err = errors.New("is a directory, want a file of URLs")
		}
		if err != nil {
			inFile.Close()
			return nil, nil, nil, fmt.Errorf("-urls %s: %w", cfg.urls, err)
		}
		in, inInfo = inFile, fi
	} else if f, ok := stdin.(interface{ Stat() (os.FileInfo, error) }); ok {
		// crawl-demo -urls - -out FILE < FILE: the shell opened FILE for us.
		if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() {
			inInfo = fi
		}
	}
	closeIn := func() {
		if inFile != nil {
			inFile.Close()
		}
	}
	if cfg.out != "" && cfg.out != "-" {
		if inInfo != nil {
			if fi, err := os.Stat(cfg.out); err == nil && os.SameFile(inInfo, fi) {
				closeIn()
				what := "the -urls file"
				if cfg.urls == "-" {
					what = "the file stdin reads (-urls -)"
				}
				return nil, nil, nil, fmt.Errorf("-out %s: is %s, which it would overwrite", cfg.out, what)
			}
		}
		if outFile, err = os.Create(cfg.out); err != nil {
			closeIn()
			return nil, nil, nil, fmt.Errorf("-out: %w", err)
		}
		out = outFile
	}
	return in, out, func() error {
		closeIn()
		if outFile != nil {
			if err := outFile.Close(); err != nil {
				return fmt.Errorf("-out: %w", err)
			}
		}
		return nil
	}, nil
}

// summary counts the lines a crawl wrote.
type summary struct {
	urls        int  // lines written: every URL read
	ok          int  // successes
	failed      int  // errors other than interruptions
	interrupted int  // URLs read but not fetched
	inputEnded  bool // the input was read to its end, not stopped early
}

// crawl reads URLs from in and has workers goroutines get them, writing each
// URL's line with write, in completion order. Blank lines and lines starting
// with '#' are skipped; any other line gets exactly one line: its result, an
// error for a line that is not an absolute http(s) URL or is longer than
// maxLine, or the interrupted error when ctx ends before it is fetched. Once
// ctx ends it reads no further, also when a read is in progress: a stalled
// stdin (a producer that keeps its pipe open) does not hold the crawl. A
// URL's host goes through group before the workers share out (hostQueue):
// URLs whose hosts group alike count as one host there.
//
// It returns when every goroutine it started has returned, but for one: a
// read of in that ctx's end gave up on goes on in a goroutine of its own
// until in delivers, ends or fails (abandonedRead), which then returns.
// The error is the first of reading in and writing; a write error also
// stops the crawl.
func crawl(ctx context.Context, in io.Reader, workers int, group func(host string) string, get func(context.Context, string) result, write func(result) error) (summary, error) {
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	jobs := newHostQueue(workers, lookahead*workers)
	results := make(chan result, workers)
	var wg sync.WaitGroup
	var readErr error
	var stopped bool // reading stopped because ctx ended, before the input's end
	wg.Go(func() {
		defer jobs.close()
		rd, done := abandonedRead(ctx, in)
		defer done()
		readErr = readLines(rd, maxLine, func(line string, tooLong bool) {
			line = strings.TrimSpace(line)
			switch {
			case tooLong:
				results <- result{URL: shorten(line), Error: fmt.Sprintf("line longer than %d bytes: not read", maxLine)}
			case line == "" || strings.HasPrefix(line, "#"):
			default:
				host, err := checkURL(line)
				if err != nil {
					results <- result{URL: line, Error: err.Error()}
					return
				}
				if !jobs.put(ctx, job{url: line, host: group(host)}) {
					results <- result{URL: line, Error: interrupted}
				}
			}
		}, func() bool {
			stopped = ctx.Err() != nil
			return !stopped
		})
		if errors.Is(readErr, errReadAbandoned) {
			readErr, stopped = nil, true
		}
	})
	var workersWG sync.WaitGroup
	for range workers {
		workersWG.Go(func() {
			for {
				j, ok := jobs.take(ctx)
				if !ok {
					return
				}
				results <- get(ctx, j.url)
				jobs.done(j)
			}
		})
	}
	go func() { // ends once the reader and the workers have
		wg.Wait()
		workersWG.Wait()
		for _, j := range jobs.drain() { // read, never taken: ctx ended
			results <- result{URL: j.url, Error: interrupted}
		}
		close(results)
	}()

	var sum summary
	var writeErr error
	for r := range results {
		sum.urls++
		switch {
		case r.ok():
			sum.ok++
		case r.Error == interrupted:
			sum.interrupted++
		default:
			sum.failed++
		}
		if writeErr != nil {
			continue
		}
		if writeErr = write(r); writeErr != nil {
			stop(writeErr)
		}
	}
	// The reader's variables are safe to read: results is closed after it
	// returned.
	sum.inputEnded = readErr == nil && !stopped
	if readErr != nil {
		readErr = fmt.Errorf("read URLs: %w", readErr)
	}
	return sum, errors.Join(readErr, writeErr)
}

// errReadAbandoned is what a read returns that ctx's end gave up on.
var errReadAbandoned = errors.New("read abandoned: the crawl is stopping")

// abandonedRead returns a reader of r whose reads are given up when ctx
// ends: a Read then returns errReadAbandoned at once. Each Read reads r in
// a goroutine of its own, and no further ahead: a read of r that was given
// up on goes on until r delivers, ends or fails (a read cannot be
// cancelled), and what it reads is dropped. The caller calls done when it
// reads no more, which ends the goroutine once no read is in progress.
func abandonedRead(ctx context.Context, r io.Reader) (rd io.Reader, done func()) {
	a := &abandonable{ctx: ctx, want: make(chan int), got: make(chan chunk, 1)}
	go func() {
		var buf []byte
		for n := range a.want {
			if cap(buf) < n {
				buf = make([]byte, n)
			}
			k, err := r.Read(buf[:n])
			a.got <- chunk{buf[:k], err} // buffered: sent even when given up on
		}
	}()
	return a, func() { close(a.want) }
}

type abandonable struct {
	ctx  context.Context
	want chan int   // a Read asks the goroutine for up to this many bytes
	got  chan chunk // its answer
}

type chunk struct {
	b   []byte
	err error
}

func (a *abandonable) Read(p []byte) (int, error) {
	if a.ctx.Err() != nil {
		return 0, errReadAbandoned
	}
	select {
	case a.want <- len(p):
	case <-a.ctx.Done(): // the goroutine is still in a read given up on
		return 0, errReadAbandoned
	}
	select {
	case c := <-a.got:
		return copy(p, c.b), c.err
	case <-a.ctx.Done():
		return 0, errReadAbandoned
	}
}

// readLines calls line for every line of r, without its line break, while
// more reports true (it is asked before each line is read). A line longer
// than max bytes is passed truncated, with tooLong set, and its rest is
// skipped. A UTF-8 byte order mark before the first line (as some editors
// on Windows write) is dropped. It returns r's first error other than
// io.EOF.
func readLines(r io.Reader, max int, line func(s string, tooLong bool), more func() bool) error {
	br := bufio.NewReaderSize(r, 64<<10)
	var buf []byte
	tooLong, first := false, true
	for {
		if len(buf) == 0 && !tooLong && !more() {
			return nil
		}
		chunk, err := br.ReadSlice('\n')
		switch {
		case tooLong:
		case len(buf)+len(chunk) > max:
			tooLong = true
			buf = append(buf, chunk[:min(len(chunk), max-len(buf))]...)
		default:
			buf = append(buf, chunk...)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		// A last line without a newline is a line; a partial one cut by a
		// read error is not, and is not fetched.
		if err == nil || errors.Is(err, io.EOF) && len(buf) > 0 {
			s := strings.TrimRight(string(buf), "\r\n")
			if first {
				s, first = strings.TrimPrefix(s, "\ufeff"), false
			}
			line(s, tooLong)
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		buf, tooLong = buf[:0], false
	}
}

// lookahead is how many URLs read, per worker, may wait for a worker: how
// far ahead the crawl looks for a URL of a host that is not busy. A URL
// line takes up to maxLine bytes.
const lookahead = 8

// shorten returns the start of an over-long line, for its error line.
func shorten(s string) string {
	if len(s) <= shownPrefix {
		return s
	}
	return strings.ToValidUTF8(s[:shownPrefix], "") + "…"
}
