// Pipeline is an ETL job, written the way such jobs usually are, whose calls
// to a rate-limited third-party API all wait on fleetgate's quota.
//
// It reads records from a CSV file, enriches each one with a call to the
// API (an errgroup of -workers goroutines, every call through an
// http.Client whose Transport is transport.New), and writes the enriched
// records as CSV, in input order. The quota (-rule) keeps the calls under
// the API's limit, with the throttle's margin added to the window for the
// time a call takes to reach the API; a 429 that gets through anyway
// pauses every worker, in every copy, for its Retry-After.
//
// Without -api it starts a fake API on loopback that allows 20 requests
// per second and answers 429 past that, so the default -rule, 20/1s, runs
// it at full speed without a single 429. Try -rule 40/1s to see what the
// quota prevents: the 429s, and the pauses and retries they cost.
//
// With REDIS_URL set (redis://[:PASSWORD@]HOST:PORT[/DB], rediss:// for
// TLS, or unix://) the quota lives in that Redis server, so several copies
// of the job share one API limit between them. It is one server, not a
// Cluster nor Sentinel (cmd/crawl-demo's -redis takes those). Run from the
// repository root:
//
//	go run ./examples/pipeline -out /tmp/enriched.csv
//	REDIS_URL=redis://127.0.0.1:6379/0 go run ./examples/pipeline -out /tmp/a.csv &
//	REDIS_URL=redis://127.0.0.1:6379/0 go run ./examples/pipeline -out /tmp/b.csv
//
// (Each copy then starts its own fake API; both listen on 127.0.0.1, the
// target the quota is kept for, so together they stay within 20/1s.)
//
// Each attempt of a call has -api-timeout (10s by default) from the moment
// the quota lets it go to the end of the answer's body; the wait on the
// quota before it does not count. An attempt that runs out of time is
// retried like any other timeout, and so is one whose answer's body
// breaks off after its headers (cut short, reset, or past -api-timeout):
// an API that never answers, or never ends its answers, costs a record at
// most 4 requests of -api-timeout each, every one of them waiting on the
// quota.
//
// A record it cannot enrich (a line that is not CSV, a wrong number of
// fields, a country code that is not two letters, or a call that failed
// for good, after the transport's retries, or whose 200 was not a
// country) is rejected alone: it is left out of the output, reported on
// stderr with its line and the reason (and the line's text, cut at 200
// bytes, for a line that is not CSV), and with -rejects written to that
// CSV file, in full, so that it can be fixed and run again; every other
// record is enriched and written. After a line that is not CSV (an
// unclosed quote, say) reading goes on at the next line. The job then
// exits 1. Only an interrupt stops it early, and then it writes nothing.
//
// Exit status: 0 when every record was enriched and written; 1 when some
// were rejected, when the run was interrupted, or when the output could
// not be written; 2 for a bad command line or configuration (a bad flag
// value, an input that cannot be read or has no country_code column, an
// -out or -rejects file that cannot be created, a bad REDIS_URL or a Redis
// that does not answer), reported before any API call. Run it with -h for
// the flags.
//
// -out and -rejects are written under a temporary name beside them and
// renamed into place once complete: a run that fails or is interrupted
// leaves an earlier file as it was.
//
// The -rejects file has the input's columns and three more:
// rejected_line (the input line the record starts on), rejected_reason,
// and rejected_text. A record with the header's number of fields is in
// the input's columns as read, its rejected_text empty; a line that is not
// CSV, or a record with another number of fields, has empty input columns
// and its text, exactly as in the input (every line of it), in
// rejected_text. The file can be given to -in once fixed: the three
// columns are then dropped, and a record whose rejected_text is still not
// empty is rejected again with that text, so nothing is lost.
//
// It prints a summary on stderr: records, enriched, rejected, API calls
// (requests written to the API, as it counts them: net/http's own resends
// on a fresh connection included, a dial that failed is none), 429s,
// elapsed time.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetgate/fleetgate/internal/secret"
	"github.com/fleetgate/fleetgate/throttle"
	"github.com/fleetgate/fleetgate/transport"
)

// config is what the flags and the environment set.
type config struct {
	in       string    // the input CSV file; "-" for stdin
	stdin    io.Reader // read for -in -
	out      string    // the output CSV file; "" or "-" for stdout
	rejects  string    // the CSV file for rejected records; "" for none
	api      string    // the API's base URL; "" starts the fake API
	rule     string    // the quota, N/DURATION (throttle.ParseRule)
	margin   time.Duration
	timeout  time.Duration // -api-timeout: bound on each attempt of an API call
	workers  int           // API calls in flight at most
	redisURL string        // REDIS_URL; "" keeps the quota in this process
}

func main() {
	redis.SetLogger(redisLogger{slog.New(slog.NewTextHandler(os.Stderr, nil))}) // one per process
	// SIGTERM too: what a supervisor (systemd, Kubernetes) sends to stop
	// the job. After the first signal, a second one ends the process at
	// once.
	ctx, stop := notifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli(ctx, os.Args[1:], os.Getenv("REDIS_URL"), os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// sameFile reports whether the file names a and b (neither "" nor "-",
// stdout) name one file: two paths to one existing file, or, for a file
// not made yet, one path however spelled (relative or absolute, through a
// symbolic link to its directory, with "." or "..").
func sameFile(a, b string) bool {
	if a == "" || b == "" || a == "-" || b == "-" {
		return false
	}
	if pathOf(a) == pathOf(b) {
		return true
	}
	fa, errA := os.Stat(a)
	fb, errB := os.Stat(b)
	return errA == nil && errB == nil && os.SameFile(fa, fb)
}

// pathOf returns the absolute path of the file name, its symbolic links
// followed: the file's own when it exists, else its directory's. Links
// are followed before ".." is applied, as the kernel does
// ("a/link/../f" is f in the link's target's parent). Whatever cannot be
// resolved is left as it is.
func pathOf(name string) string {
	real, err := filepath.EvalSymlinks(name)
	if err != nil {
		dir, file := filepath.Split(name)
		if dir == "" {
			dir = "."
		}
		if real, err = filepath.EvalSymlinks(dir); err != nil {
			real = dir
		}
		real = filepath.Join(real, file)
	}
	if abs, err := filepath.Abs(real); err == nil {
		return abs
	}
	return filepath.Clean(real)
}

// defaultAPITimeout is -api-timeout's default: far more than a lookup of
// one country takes, far less than a job should sit on an API that hangs.
const defaultAPITimeout = 10 * time.Second

// usage heads the -h text; the flags follow it.
const usage = `Usage: pipeline [flags]

Reads the CSV file -in, enriches every record through the API, each call
waiting on the fleet quota (shared by every copy with the same REDIS_URL),
and writes the enriched records to -out and the rejected ones to -rejects.

Exit status: 0 when every record was enriched and written; 1 when some
were rejected (each is reported, and every other record is still
written), when the run was interrupted, or when the output could not be
written; 2 for a bad command line or configuration (a bad flag value, an
input that cannot be read or has no country_code column, an -out or
-rejects file that cannot be created, a bad REDIS_URL or a Redis that
does not answer), reported before any API call.

Flags:
`

// cli runs the job with the command line args and REDIS_URL, until it is
// done or ctx ends, and returns its exit status (see usage).
func cli(ctx context.Context, args []string, redisURL string, stdout, stderr io.Writer) int {
	cfg := config{redisURL: redisURL, stdin: os.Stdin}
	fs := flag.NewFlagSet("pipeline", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are reported below, the usage for -h only
	fs.Usage = func() {}
	fs.StringVar(&cfg.in, "in", "testdata/records.csv", "input CSV `file`, with a country_code column (- for stdin)")
	fs.StringVar(&cfg.out, "out", "", "output CSV `file` (default stdout)")
	fs.StringVar(&cfg.rejects, "rejects", "", "CSV `file` for the records that could not be enriched, in full, with their line and the reason (default: only reported on stderr)")
	fs.StringVar(&cfg.api, "api", "", "enrichment API base `URL`: each call's path goes after its path, and its query (an API key, say: never shown) with every call (default: start a fake API on loopback)")
	fs.StringVar(&cfg.rule, "rule", fmt.Sprintf("%d/%v", fakeAPILimit, fakeAPIWindow), "the API's quota, N/DURATION, shared with every copy using the same REDIS_URL")
	fs.DurationVar(&cfg.margin, "margin", throttle.DefaultMargin, "guard interval added to the rule's window: more than a call takes to reach the API (at least 20ms)")
	fs.DurationVar(&cfg.timeout, "api-timeout", defaultAPITimeout, "bound on each attempt of an API call, from sending it to reading the whole answer (not the wait on the quota)")
	fs.IntVar(&cfg.workers, "workers", 8, "API calls in flight at most")
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fs.SetOutput(stderr)
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
		return 0
	case err != nil:
		err = &configError{err}
	case fs.NArg() > 0:
		err = badConfig("unexpected argument %q: flags only (the input is the file -in names)", fs.Arg(0))
	default:
		err = run(ctx, cfg, stdout, stderr)
	}
	var ce *configError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ce):
		// One line naming the problem and a hint, as cmd/crawl-demo
		// does: the whole usage is for -h.
		fmt.Fprintf(stderr, "pipeline: %v\nRun pipeline -h for the flags.\n", err)
		return 2
	}
	// One error per line: a file that could not be written, the rejects.
	fmt.Fprintf(stderr, "pipeline: %s\n", strings.ReplaceAll(err.Error(), "\n", "\npipeline: "))
	return 1
}

// checkAPI returns an error unless raw, the -api flag, is an http:// or
// https:// URL with a host. The error quotes raw as shownURL does, its
// password and its query's values as "xxxxx"; raw that does not parse is
// not quoted at all
// (url.Parse's error quotes the part that failed, which may be the
// password), nor is what follows the scheme of a URL with no "//"
// ("user:password@host" parses as the scheme "user"), nor a URL with no
// scheme at all ("token@host/x").
func checkAPI(raw string) error {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return fmt.Errorf("-api: not a URL: %s", secret.URLError(err, "http:// or https://"))
	case u.Opaque != "":
		return fmt.Errorf("-api %q: want an http:// or https:// URL", u.Scheme+":…")
	case u.Scheme == "": // "token@host/x" parses as a path
		return errors.New("-api: no scheme: want an http:// or https:// URL")
	case u.Scheme != "http" && u.Scheme != "https" || u.Host == "":
		return fmt.Errorf("-api %q: want an http:// or https:// URL", shownURL(u))
	}
	return nil
}

// configError is a bad command line, environment or input file, found
// before any API call: the job exits 2 for it.
type configError struct{ err error }

func (e *configError) Error() string { return e.err.Error() }
func (e *configError) Unwrap() error { return e.err }

// badConfig returns a *configError with the message fmt.Errorf makes.
func badConfig(format string, a ...any) error {
	return &configError{fmt.Errorf(format, a...)}
}

// run reads cfg.in, enriches every record through the quota, writes the
// enriched records to cfg.out and the rejected ones to cfg.rejects, and
// prints a summary on stderr. A bad configuration, an unreadable input or
// an output file that cannot be created is a *configError, and ctx ending
// an error, before anything is written. Otherwise every reject is reported
// on stderr and the summary printed, whether or not the files could be
// written; each file that could not and the rejected records make errors,
// joined.
func run(ctx context.Context, cfg config, stdout, stderr io.Writer) error {
	start := time.Now()
	rule, err := throttle.ParseRule(cfg.rule)
	if err != nil {
		return badConfig("-rule: %w", err)
	}
	if cfg.rejects == "-" {
		return badConfig("-rejects -: want a file (stdout carries the output)")
	}
	for _, f := range []struct{ a, b, what string }{
		{cfg.out, cfg.in, "-out is the -in file, which it would overwrite"},
		{cfg.rejects, cfg.in, "-rejects is the -in file, which it would overwrite"},
		{cfg.rejects, cfg.out, "-rejects is the -out file: one would overwrite the other"},
	} {
		if sameFile(f.a, f.b) {
			return badConfig("%s %s", f.a, f.what)
		}
	}
	if cfg.margin < throttle.MinMargin {
		return badConfig("-margin %v: want at least %v", cfg.margin, throttle.MinMargin)
	}
	if cfg.margin > throttle.MaxWindow {
		return badConfig("-margin %v: want at most 366 days", cfg.margin)
	}
	if cfg.timeout <= 0 {
		return badConfig("-api-timeout %v: want more than 0", cfg.timeout)
	}
	if cfg.workers < 1 {
		return badConfig("-workers %d: want at least 1", cfg.workers)
	}
	in, err := readInput(cfg.in, cfg.stdin)
	if err != nil {
		return badConfig("-in: %w", err)
	}
	// Found now, a file that cannot be written costs no API call; written
	// at the end, it replaces an earlier one only when complete.
	out, err := openOutput("-out", cfg.out)
	if err != nil {
		return &configError{err}
	}
	defer out.discard()
	var rej *output // nil: rejects are only reported
	if cfg.rejects != "" {
		if rej, err = openOutput("-rejects", cfg.rejects); err != nil {
			return &configError{err}
		}
		defer rej.discard()
	}

	api := cfg.api
	var fake *fakeAPI
	if api == "" {
		if fake, err = startAPI(fakeAPILimit, fakeAPIWindow); err != nil {
			return fmt.Errorf("start the fake API: %w", err)
		}
		defer fake.Close()
		api = fake.URL
	} else if err := checkAPI(cfg.api); err != nil {
		return &configError{err}
	}

	log := slog.New(slog.NewTextHandler(stderr, nil))
	q, err := openQuota(ctx, cfg.redisURL, rule, cfg.margin, log)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("%w while connecting to Redis: %w", context.Cause(ctx), err)
		}
		return &configError{err} // a bad REDIS_URL, or a Redis that does not answer as a master
	}
	defer q.Close()

	// One idle connection per worker: without it most calls would open a
	// new connection, whose handshake delays its arrival at the API.
	base := http.DefaultTransport.(*http.Transport).Clone()
	base.MaxIdleConnsPerHost = cfg.workers
	defer base.CloseIdleConnections()
	var calls, tooMany atomic.Int64
	// -api-timeout bounds each attempt from when the quota lets it go
	// until its answer's body is closed; the wait on the quota does not
	// count, a second wait the transport makes when the connection came
	// too late for the attempt's slot does. An attempt that runs out is
	// retried like any other timeout (its body's too: enricher.lookup,
	// which picks the client with the attempts a record has left).
	var clients [transport.DefaultAttempts]*http.Client
	for i := range clients {
		clients[i] = &http.Client{Transport: transport.New(&countingTransport{base: base, wrote: &calls}, q.Throttler,
			transport.WithRetries(i+1),
			transport.WithAttemptTimeout(cfg.timeout),
			transport.WithLogger(log),
			transport.OnAttempt(func(a transport.AttemptInfo) {
				if a.Status == http.StatusTooManyRequests {
					tooMany.Add(1)
				}
			}),
		)}
	}

	apiURL, err := url.Parse(api)
	if err != nil { // checkAPI took it
		return errors.New("-api: not a URL")
	}
	records, rejects, err := enrich(ctx, in, &enricher{clients: clients, api: apiURL, timeout: cfg.timeout}, cfg.workers)
	if err != nil {
		return err
	}
	rejects = append(rejects, in.rejects...)
	slices.SortStableFunc(rejects, func(a, b reject) int { return cmp.Compare(a.line, b.line) })
	// A file that cannot be written does not stop the other, nor the report
	// of every reject and the summary below.
	var errs []error
	if err := out.commit(stdout, append(slices.Clip(in.header), enrichedColumns...), records); err != nil {
		errs = append(errs, err)
	}
	if rej != nil {
		rows := make([][]string, len(rejects))
		for i, r := range rejects {
			rows[i] = r.row(len(in.header))
		}
		if err := rej.commit(stdout, append(slices.Clip(in.header), rejectColumns...), rows); err != nil {
			errs = append(errs, err)
		}
	}
	for _, r := range rejects {
		if r.record == nil {
			fmt.Fprintf(stderr, "pipeline: line %d rejected: %v: %q\n", r.line, r.err, shorten(r.raw))
			continue
		}
		fmt.Fprintf(stderr, "pipeline: line %d rejected: %v\n", r.line, r.err)
	}
	total := len(records) + len(rejects)
	fmt.Fprintf(stderr, "pipeline: %d records: %d enriched, %d rejected; %d API calls, %d answered 429, %v (quota %v, %s)\n",
		total, len(records), len(rejects), calls.Load(), tooMany.Load(), time.Since(start).Round(time.Millisecond), rule, q.where)
	if fake != nil {
		st := fake.Site.Stats()
		fmt.Fprintf(stderr, "pipeline: the fake API allows %d per %v; it saw %d requests, at most %d in one window, %d answered 429\n",
			fakeAPILimit, fakeAPIWindow, st.Requests, st.Peak, st.TooMany)
	}
	if len(rejects) > 0 {
		errs = append(errs, fmt.Errorf("%d of %d records rejected, each reported above", len(rejects), total))
	}
	return errors.Join(errs...)
}
