package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetgate/fleetgate/internal/fakesite"
	"github.com/fleetgate/fleetgate/throttle"
)

// The demo's site and fleet.
const (
	demoLimit   = 20          // the site allows demoLimit requests…
	demoWindow  = time.Second // …in any closed interval of demoWindow, then bans
	demoGroups  = 3           // the fleet's "processes"
	demoWorkers = 4           // workers per group, unless -workers says otherwise
)

// demoRule is the throttle rule for the demo's site when no -rule is given:
// exactly the site's limit, paced evenly over the window so the chart reads
// easily. Without the gap the fleet sends each window's requests in one
// burst at its start, which the site allows just as well.
var demoRule = throttle.Rule{Limit: demoLimit, Window: demoWindow, Gap: demoWindow / demoLimit}

// runDemo runs the demo, or with -serve only its site, and returns the exit
// status: 0 when the site banned nobody, 1 otherwise.
func runDemo(ctx context.Context, cfg *config, stdout, stderr io.Writer, log *slog.Logger) int {
	if cfg.serve != "" {
		return serveSite(ctx, cfg, stdout, stderr)
	}
	var site *fakesite.Site
	target := strings.TrimSuffix(cfg.target, "/")
	if target == "" {
		site = newDemoSite()
		srv, err := startSite(site, "127.0.0.1:0")
		if err != nil {
			fmt.Fprintf(stderr, "crawl-demo: %v\n", err)
			return 1
		}
		defer srv.close()
		target = srv.url
	}
	u, _ := url.Parse(target) // checked by parseFlags, or ours
	rules, err := cfg.throttleRules()
	if err == nil && len(cfg.rules) == 0 {
		err = rules.Set(u.Hostname(), demoRule)
	}
	if err != nil {
		fmt.Fprintf(stderr, "crawl-demo: %v\n", err)
		return 2
	}
	f, err := newFleet(ctx, cfg, rules, log)
	if err != nil {
		fmt.Fprintf(stderr, "crawl-demo: %v\n", err)
		return 2
	}
	defer f.close()
	// The quota's target: what the table and the log name, not the URL's
	// host:port.
	name, rule, err := f.groups[0].thr.Target(ctx, u.Host)
	if err != nil {
		fmt.Fprintf(stderr, "crawl-demo: %v\n", err)
		return 2
	}

	store := "embedded store (one throttler shared by the groups)"
	if cfg.redis != nil {
		store = "Redis at " + cfg.redis.shown + " (a client and a throttler per group)"
	}
	siteDesc := "a local site that"
	if site == nil {
		siteDesc = "a site assumed to be crawl-demo -serve, which"
	}
	fmt.Fprintf(stdout, "crawl-demo: %d groups × %d workers fetch %d pages from %s\n", demoGroups, cfg.workers, cfg.pages, hidePassword(target))
	fmt.Fprintf(stdout, "  %s allows %d requests in any %v and bans a client that sends more\n", siteDesc, demoLimit, demoWindow)
	fmt.Fprintf(stdout, "  quota of target %s (-key %v): rule %s, margin %v, %s\n\n", name, cfg.keyMode.String(), rule, cfg.margin, store)

	start := time.Now()
	prog := startProgress(stderr, f.rec.status(cfg.pages))
	f.crawl(ctx, target, cfg.pages)
	elapsed := time.Since(start)
	prog.Stop()

	rep, arrivals, basis := f.rec.report(name, elapsed)
	banned := rep.Banned > 0
	if site != nil {
		st := site.Stats()
		rep = siteReportOf(name, st, elapsed)
		arrivals, basis, banned = st.Arrivals, "as the site saw them", st.Bans > 0
	}
	return finish(stdout, stderr, cfg.chart, rep, arrivals, start, basis, banned, ctx.Err() != nil, cfg.pages-f.rec.fetched())
}

// finish prints the table, writes the chart and the verdict, and returns
// the exit status: 1 for a ban, an interrupted run, or pages of the crawl
// that were not fetched (unfetched), 0 otherwise.
func finish(stdout, stderr io.Writer, chartPath string, rep siteReport, arrivals []time.Time, start time.Time, basis string, banned, stopped bool, unfetched int) int {
	if err := writeTable(stdout, []siteReport{rep}); err != nil {
		fmt.Fprintf(stderr, "crawl-demo: %v\n", err)
		return 1
	}
	c := chart{
		Title: fmt.Sprintf("%d requests to %s, %s: limit %d per %v, peak %d",
			rep.Requests, rep.Target, basis, rep.Limit, rep.Window, rep.Peak),
		Arrivals: arrivals, Start: start, Limit: rep.Limit, Window: rep.Window,
	}
	if err := c.write(chartPath); err != nil { // validate found it writable: it changed since
		fmt.Fprintf(stderr, "crawl-demo: -chart: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "\nchart: %s (requests per %v and in any %v, against the limit)\n", chartPath, chartTick, rep.Window)
	switch {
	case banned:
		fmt.Fprintf(stdout, "result: BANNED: up to %d requests in %v, over the limit of %d, %s\n", rep.Peak, rep.Window, rep.Limit, basis)
		return 1
	case stopped:
		fmt.Fprintf(stdout, "result: interrupted; no ban so far: at most %d requests in any %v (limit %d), %s\n", rep.Peak, rep.Window, rep.Limit, basis)
		return 1
	case unfetched > 0:
		fmt.Fprintf(stdout, "result: no ban, but %d pages were not fetched (-v shows why); at most %d requests in any %v (limit %d), %s\n",
			unfetched, rep.Peak, rep.Window, rep.Limit, basis)
		return 1
	}
	fmt.Fprintf(stdout, "result: no ban; at most %d requests in any %v (limit %d), %s\n", rep.Peak, rep.Window, rep.Limit, basis)
	return 0
}

// newDemoSite returns the demo's strict site.
func newDemoSite() *fakesite.Site {
	return fakesite.New(fakesite.Config{Limit: demoLimit, Window: demoWindow, Ban: true})
}

// serveSite runs only the demo's site (-serve) until ctx ends, then reports
// what it saw.
func serveSite(ctx context.Context, cfg *config, stdout, stderr io.Writer) int {
	site := newDemoSite()
	srv, err := startSite(site, cfg.serve)
	if err != nil {
		fmt.Fprintf(stderr, "crawl-demo: -serve %s: %v\n", cfg.serve, err)
		return 2
	}
	fmt.Fprintf(stdout, "crawl-demo: serving the demo site at %s\n", srv.url)
	fmt.Fprintf(stdout, "  it allows %d requests in any %v per client and bans a client that sends more; Ctrl-C stops it and prints what it saw\n\n", demoLimit, demoWindow)
	start := time.Now()
	prog := startProgress(stderr, func() status {
		st := site.Stats()
		return status{text: fmt.Sprintf("requests %d  peak %d of %d per %v  bans %d", st.Requests, st.Peak, demoLimit, demoWindow, st.Bans)}
	})
	<-ctx.Done()
	prog.Stop()
	srv.close()
	st := site.Stats()
	// The row names the target a crawler's quota for this site is keyed on
	// (by host, or by IP: the same for an address); the first line gave
	// its URL.
	name, err := throttle.Normalize(strings.TrimPrefix(srv.url, "http://"))
	if err != nil { // the address we listened on
		name = strings.TrimPrefix(srv.url, "http://")
	}
	rep := siteReportOf(name, st, span(st.Arrivals))
	if len(st.Arrivals) > 0 {
		start = st.Arrivals[0]
	}
	return finish(stdout, stderr, cfg.chart, rep, st.Arrivals, start, "as the site saw them", st.Bans > 0, false, 0)
}

// siteServer is a running HTTP server for a site.
type siteServer struct {
	srv  *http.Server
	url  string // http://ADDR
	done chan error
}

// startSite serves site on addr until close.
func startSite(site http.Handler, addr string) (*siteServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("start the demo site: %w", err)
	}
	s := &siteServer{srv: &http.Server{Handler: site, ReadHeaderTimeout: 5 * time.Second}, url: "http://" + ln.Addr().String(), done: make(chan error, 1)}
	go func() { s.done <- s.srv.Serve(ln) }()
	return s, nil
}

// close stops the server, waiting briefly for requests in flight.
func (s *siteServer) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := s.srv.Shutdown(ctx); err != nil {
		s.srv.Close()
	}
	<-s.done
}

// fleet is the demo's crawlers: groups that behave like separate processes.
type fleet struct {
	groups  []group
	workers int
	rec     *recorder
	shared  *throttle.Throttler // with the embedded store: the groups' one throttler
}

// group is one "process" of the fleet.
type group struct {
	thr    *throttle.Throttler
	close  func()                // with -redis: closes thr and its store
	rdb    redis.UniversalClient // with -redis: the group's own client
	client *fleetClient
}

// newFleet builds demoGroups groups. With -redis each has its own client
// and throttler, as separate processes would; with the embedded store they
// share one throttler, the only way to share its quota.
func newFleet(ctx context.Context, cfg *config, rules *throttle.Rules, log *slog.Logger) (*fleet, error) {
	f := &fleet{workers: cfg.workers, rec: &recorder{}}
	if cfg.redis == nil {
		thr, _, err := newThrottler(cfg, rules, nil, log) // closed by Close
		if err != nil {
			return nil, err
		}
		f.shared = thr
	}
	for i := range demoGroups {
		g := group{thr: f.shared}
		if cfg.redis != nil {
			g.rdb = cfg.redis.client()
			if i == 0 {
				if err := checkRedis(ctx, cfg.redis, g.rdb, throttle.FailurePolicy(cfg.policy), log); err != nil {
					g.rdb.Close()
					f.close()
					return nil, err
				}
			}
			thr, closeThr, err := newThrottler(cfg, rules, g.rdb, log.With("group", i+1))
			if err != nil {
				g.rdb.Close()
				f.close()
				return nil, err
			}
			g.thr, g.close = thr, closeThr
		}
		g.client = newFleetClient(cfg, g.thr, log.With("group", i+1), f.rec)
		f.groups = append(f.groups, g)
	}
	return f, nil
}

// crawl fetches target/page/1 … target/page/pages with every worker of every
// group, and returns when they are done or ctx has ended.
func (f *fleet) crawl(ctx context.Context, target string, pages int) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for _, g := range f.groups {
		for range f.workers {
			wg.Go(func() {
				for ctx.Err() == nil {
					k := next.Add(1)
					if k > int64(pages) {
						return
					}
					f.rec.page(fetch(ctx, g.client, fmt.Sprintf("%s/page/%d", target, k)))
				}
			})
		}
	}
	wg.Wait()
}

// close releases every group's connections, throttler and client. Their
// errors at exit would change nothing, so they are dropped.
func (f *fleet) close() {
	for _, g := range f.groups {
		g.client.close()
		if g.rdb != nil {
			g.close()
			_ = g.rdb.Close()
		}
	}
	if f.shared != nil {
		_ = f.shared.Close()
	}
}

// recorder counts what reached the target and what it answered; a dial
// that failed reached nothing, as the crawler's attempts count it. It is
// an observer, safe for concurrent use.
type recorder struct {
	mu        sync.Mutex
	sends     []time.Time // when each request written to the target was
	ok        int         // 2xx answers
	tooMany   int         // 429 answers
	forbidden int         // 403 answers
	pages     int         // pages finished
	pagesOK   int         // pages fetched successfully
}

// wrote records one request written to the target at at.
func (r *recorder) wrote(at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sends = append(r.sends, at)
}

// answered records one response's status.
func (r *recorder) answered(status int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case status >= 200 && status < 300:
		r.ok++
	case status == http.StatusTooManyRequests:
		r.tooMany++
	case status == http.StatusForbidden:
		r.forbidden++
	}
}

// page records one finished page.
func (r *recorder) page(res result) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pages++
	if res.ok() {
		r.pagesOK++
	}
}

// fetched returns how many pages were fetched successfully.
func (r *recorder) fetched() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pagesOK
}

// status returns the progress report of a crawl of total pages: the rate
// so far as achievedRate measures it, up to now, and the answers.
func (r *recorder) status(total int) func() status {
	return func() status {
		r.mu.Lock()
		defer r.mu.Unlock()
		rate := achievedRate(r.sends, demoWindow, time.Now())
		return status{done: r.pages, total: total,
			text: fmt.Sprintf("%.1f req/s  2xx %d  429 %d  403 %d", rate, r.ok, r.tooMany, r.forbidden)}
	}
}

// report returns the table row for target from what this process wrote
// to it, the write times, and a phrase saying so.
func (r *recorder) report(target string, elapsed time.Duration) (siteReport, []time.Time, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sends := append([]time.Time(nil), r.sends...)
	rep := newSiteReport(target, sends, fakesite.Peak(sends, demoWindow), demoLimit, demoWindow, elapsed)
	rep.OK, rep.TooMany, rep.Banned = r.ok, r.tooMany, r.forbidden
	return rep, sends, "as this process sent them"
}

// span returns the time from the earliest to the latest of ts.
func span(ts []time.Time) time.Duration {
	lo, hi := bounds(ts)
	return hi.Sub(lo)
}

// bounds returns the earliest and the latest of ts, in any order; zero
// times when ts is empty.
func bounds(ts []time.Time) (lo, hi time.Time) {
	if len(ts) == 0 {
		return time.Time{}, time.Time{}
	}
	lo, hi = ts[0], ts[0]
	for _, t := range ts[1:] {
		if t.Before(lo) {
			lo = t
		}
		if t.After(hi) {
			hi = t
		}
	}
	return lo, hi
}
