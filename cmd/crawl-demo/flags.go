package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/fleetgate/fleetgate/throttle"
)

// config is the parsed command line.
type config struct {
	// The crawler (-urls) and the demo's fleet.
	urls     string        // -urls: file of URLs, "-" for stdin; "" runs the demo
	out      string        // -out: JSON Lines file, "" or "-" for stdout
	redisURL string        // -redis as given; never print it (it may hold a password)
	listLogs bool          // -redis-list-logs: throttle.WithListLogs
	redis    *redisConfig  // -redis parsed; nil for the embedded store
	rules    ruleSpecs     // -rule, in order
	def      ruleValue     // -default
	workers  int           // -workers
	retries  int           // -retries: retries after the first attempt
	margin   time.Duration // -margin
	keyMode  keyModeValue  // -key
	policy   policyValue   // -on-store-error
	timeout  time.Duration // -timeout, per attempt
	storeTO  time.Duration // -store-timeout, per store call
	verbose  bool          // -v

	// The demo only.
	chart  string // -chart
	pages  int    // -pages
	target string // -target: an existing site instead of a local one
	serve  string // -serve: only run the site, on this address
}

// maxStoreTimeout bounds -store-timeout: past it a failed store would hold
// every worker so long that the failure policy no longer means much.
const maxStoreTimeout = time.Minute

// maxWorkers bounds -workers: each worker is a goroutine with its buffers,
// and a connection per host up to that many; fifty million of them took 2.6
// GB for a file of one URL.
const maxWorkers = 10000

// maxRetries bounds -retries: a URL's attempts, retries+1, must fit an int,
// and past a hundred a URL that keeps failing would hold a worker for
// hours.
const maxRetries = 100

// Defaults of the flags.
const (
	defaultRule    = "1/1s"
	defaultWorkers = 8
	defaultRetries = 3
	defaultTimeout = 30 * time.Second
	defaultChart   = "crawl-demo.svg"
	defaultPages   = 300
)

// usageError is a command line that cannot be run: exit status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

const usageText = `Usage:
  crawl-demo [flags]                 the demo: a fleet crawls a strict local site
  crawl-demo -urls FILE [flags]      the fleet crawler: fetch every URL in FILE

The crawler reads URLs, one per line ("-" reads stdin; blank lines and lines
starting with # are skipped), fetches each through the fleet-wide throttle,
and writes one JSON object per URL per line:

  {"url":"https://example.com/","status":200,"attempts":1,"error":""}

status is 0 when no response came, error is "" on success. Exit status: 0
when every URL got a response below 400 and no error (a body cut short is
one, whatever the status), 1 when some did not (each still has
its line; on SIGINT or SIGTERM the unfetched ones say "interrupted: not
fetched"), 2 for a bad command line.

Copies of the crawler that share -redis and the same rules share every
target's limit.

The demo starts a site on loopback that allows 20 requests in any 1s and bans
a client that sends more, runs 3 groups of 4 workers through the throttle
until -pages pages are fetched, prints a table and writes a chart. Exit status
0 when no ban happened and every page was fetched, 1 otherwise (or when
interrupted). For two processes
sharing one quota through Redis, in three terminals:

  crawl-demo -serve 127.0.0.1:8080
  crawl-demo -redis redis://localhost:6379 -target http://127.0.0.1:8080
  crawl-demo -redis redis://localhost:6379 -target http://127.0.0.1:8080

The -serve process prints what the site saw when you stop it with Ctrl-C.

Flags:
`

// parseFlags parses args. It returns a *usageError for anything that cannot
// be run, or flag.ErrHelp after printing the help for -h.
func parseFlags(args []string, stderr io.Writer) (*config, error) {
	cfg := &config{
		keyMode: keyModeValue(throttle.ByHost),
		policy:  policyValue(throttle.FailLocal),
	}
	cfg.def.rule, _ = throttle.ParseRule(defaultRule)

	fs := flag.NewFlagSet("crawl-demo", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are reported by run, the help below
	fs.Usage = func() {}
	fs.StringVar(&cfg.urls, "urls", "", "crawl the URLs in `FILE`, one per line (- for stdin) instead of running the demo")
	fs.StringVar(&cfg.out, "out", "", "write the JSON Lines results to `FILE` (default stdout)")
	// A plain string: the flag package would quote a bad value, password and all.
	fs.StringVar(&cfg.redisURL, "redis", "", "share the quota through Redis at `URL`: redis://[USER:PASSWORD@]HOST:PORT[/DB] or rediss://…; several addr=HOST:PORT query parameters make it a Cluster; master_name=NAME makes HOST:PORT and the addrs Sentinels, the master's password then in password=… (default: a store inside this process)")
	fs.BoolVar(&cfg.listLogs, "redis-list-logs", false, "keep every log in a Redis list, as releases before short logs moved into meta did, while processes of such a release share -redis (a rolling upgrade: see the README)")
	fs.Var(&cfg.rules, "rule", "limit for the targets matching PATTERN (a host, an IP or *.domain): `PATTERN=N/DURATION[,gap=DURATION]`, e.g. example.com=10/1s or *.example.org=100/1m,gap=200ms (repeatable)")
	fs.Var(&cfg.def, "default", "limit for the targets no -rule matches: `N/DURATION[,gap=DURATION]`")
	fs.IntVar(&cfg.workers, "workers", defaultWorkers, "concurrent fetches, from 1 to 10000 (the demo: per group, and 4 unless set)")
	fs.IntVar(&cfg.retries, "retries", defaultRetries, "retries after the first attempt of a URL, from 0 (none) to 100")
	fs.DurationVar(&cfg.margin, "margin", throttle.DefaultMargin, "guard interval added to every rule's window (at least 20ms)")
	fs.Var(&cfg.keyMode, "key", "what shares one quota: `host|domain|ip` (default host)")
	fs.Var(&cfg.policy, "on-store-error", "what to do when the store fails: keep this process's share of each limit, drop the limits, or wait for the store: `local|open|closed` (default local)")
	fs.DurationVar(&cfg.timeout, "timeout", defaultTimeout, "bound on each attempt, from sending it to reading the whole response (not the wait for the quota)")
	fs.DurationVar(&cfg.storeTO, "store-timeout", throttle.DefaultStoreTimeout, "bound on each call to the store, past which -on-store-error decides; raise it for a Redis more than a few milliseconds away")
	fs.BoolVar(&cfg.verbose, "v", false, "debug logging on stderr: every failed attempt and every pause")
	fs.StringVar(&cfg.chart, "chart", defaultChart, "demo: write the chart, an SVG file, to `FILE`")
	fs.IntVar(&cfg.pages, "pages", defaultPages, "demo: pages to fetch")
	fs.StringVar(&cfg.target, "target", "", "demo: crawl the site at `URL` (one started with -serve) instead of starting one")
	fs.StringVar(&cfg.serve, "serve", "", "demo: only run the site, on `ADDR` (host:port), until interrupted")

	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stderr)
			fmt.Fprint(stderr, usageText)
			fs.PrintDefaults()
			return nil, err
		}
		return nil, &usageError{msg: err.Error()}
	}
	if fs.NArg() > 0 {
		return nil, usagef("unexpected argument %q: flags only (URLs go in a file given with -urls)", fs.Arg(0))
	}
	if err := cfg.validate(fs); err != nil {
		return nil, err
	}
	return cfg, nil
}

// validate checks what single flags cannot: ranges and combinations.
func (c *config) validate(fs *flag.FlagSet) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	const minMargin = throttle.MinMargin
	switch {
	case c.workers < 1:
		return usagef("-workers %d: must be at least 1", c.workers)
	case c.workers > maxWorkers:
		return usagef("-workers %d: must be at most %d", c.workers, maxWorkers)
	case c.retries < 0:
		return usagef("-retries %d: must not be negative", c.retries)
	case c.retries > maxRetries:
		return usagef("-retries %d: must be at most %d", c.retries, maxRetries)
	case c.margin < minMargin:
		return usagef("-margin %v: must be at least %v: a request may be sent up to half the margin after its slot and needs the other half to reach the target, so with less the target can see more than a rule allows in a window", c.margin, minMargin)
	case c.margin > throttle.MaxWindow:
		return usagef("-margin %v: must be at most 366 days", c.margin)
	case c.timeout <= 0:
		return usagef("-timeout %v: must be positive", c.timeout)
	case c.storeTO <= 0 || c.storeTO > maxStoreTimeout:
		return usagef("-store-timeout %v: must be positive and at most %v", c.storeTO, maxStoreTimeout)
	case c.pages < 1:
		return usagef("-pages %d: must be at least 1", c.pages)
	case set["urls"] && c.urls == "":
		return usagef("-urls \"\": want a file name, or - for stdin")
	}
	if c.urls != "" {
		for _, name := range []string{"chart", "pages", "target", "serve"} {
			if set[name] {
				return usagef("-%s applies only to the demo, not with -urls", name)
			}
		}
	} else {
		if set["out"] {
			return usagef("-out applies only with -urls")
		}
		if !set["workers"] {
			c.workers = demoWorkers
		}
	}
	if c.serve != "" {
		for _, name := range slices.Sorted(maps.Keys(set)) {
			if name != "serve" && name != "chart" && name != "v" {
				return usagef("-%s has no effect with -serve, which only runs the site (with -chart and -v)", name)
			}
		}
	}

	if set["default"] {
		for _, spec := range c.rules {
			if pattern, _, _ := strings.Cut(spec, "="); strings.TrimSpace(pattern) == throttle.DefaultPattern {
				return usagef("-default %v and -rule %q both set the limit of the targets no other rule matches: keep one", c.def.rule, spec)
			}
		}
	}
	if set["redis-list-logs"] && !set["redis"] {
		return usagef("-redis-list-logs applies only with -redis")
	}
	if c.redisURL != "" || set["redis"] {
		rc, err := parseRedisURL(c.redisURL)
		if err != nil {
			return &usageError{msg: err.Error()}
		}
		c.redis = rc
	}
	if c.target != "" {
		if _, err := checkURL(c.target); err != nil {
			return usagef("-target %q: %v", hidePassword(c.target), err)
		}
	}
	if c.urls == "" {
		if err := checkWritable(c.chart); err != nil {
			return usagef("-chart: %v", err)
		}
	}
	return nil
}

// checkWritable reports why the file at path cannot be written, without
// changing it: an existing file is opened for writing but not truncated,
// and a file that did not exist is created and removed again.
func checkWritable(path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o666)
	if err == nil {
		f.Close()
		return os.Remove(path)
	}
	if !errors.Is(err, os.ErrExist) {
		return err
	}
	if f, err = os.OpenFile(path, os.O_WRONLY, 0); err != nil { // a directory fails here
		return err
	}
	return f.Close()
}

// rules returns the throttle rules of the command line: -default for every
// target, then each -rule (-rule '*=…' replaces the built-in -default, and
// validate refuses it beside a -default that is set; two -rule flags for
// one pattern are an error).
func (c *config) throttleRules() (*throttle.Rules, error) {
	if _, err := throttle.ParseRules(c.rules...); err != nil {
		return nil, err
	}
	rs := &throttle.Rules{}
	if err := rs.Set(throttle.DefaultPattern, c.def.rule); err != nil {
		return nil, err
	}
	for _, spec := range c.rules {
		if err := rs.Parse(spec); err != nil {
			return nil, err
		}
	}
	return rs, nil
}

// ruleSpecs collects the -rule flags; each is checked when it is set.
type ruleSpecs []string

func (r *ruleSpecs) String() string { return strings.Join(*r, " ") }

// Set checks spec with throttle.Rules.Parse and keeps it.
func (r *ruleSpecs) Set(spec string) error {
	var rs throttle.Rules
	if err := rs.Parse(spec); err != nil {
		return err
	}
	*r = append(*r, spec)
	return nil
}

// ruleValue is the -default flag.
type ruleValue struct{ rule throttle.Rule }

func (v *ruleValue) String() string { return v.rule.String() }

// Set parses s with throttle.ParseRule.
func (v *ruleValue) Set(s string) error {
	r, err := throttle.ParseRule(s)
	if err != nil {
		return err
	}
	v.rule = r
	return nil
}

// keyModeValue is the -key flag.
type keyModeValue throttle.KeyMode

func (v *keyModeValue) String() string { return throttle.KeyMode(*v).String() }

// Set parses s with throttle.ParseKeyMode.
func (v *keyModeValue) Set(s string) error {
	m, err := throttle.ParseKeyMode(s)
	if err != nil {
		return err
	}
	*v = keyModeValue(m)
	return nil
}

// policyValue is the -on-store-error flag.
type policyValue throttle.FailurePolicy

func (v *policyValue) String() string { return throttle.FailurePolicy(*v).String() }

// Set parses s with throttle.ParseFailurePolicy.
func (v *policyValue) Set(s string) error {
	p, err := throttle.ParseFailurePolicy(s)
	if err != nil {
		return err
	}
	*v = policyValue(p)
	return nil
}
