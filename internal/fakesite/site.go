package fakesite

import (
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"
)

// Config describes a Site. Its zero value is a site without a limit that
// answers 200 to everything and only counts.
type Config struct {
	// Limit is how many requests one client may send in any closed interval
	// of length Window: arrivals a <= b with b-a <= Window count together.
	// Every request counts, refused ones included, as on most real sites.
	// Zero or negative means no limit.
	Limit int
	// Window is the length of the limit's interval; it must be positive
	// when Limit is.
	Window time.Duration
	// Ban makes a request over the limit ban its client (by remote IP) for
	// the rest of the Site's life: it and every later request from that
	// client get 403 Forbidden.
	Ban bool
	// RetryAfter, when positive and Ban is false, is sent with every 429
	// as a Retry-After header in whole seconds, rounded up. Without Ban,
	// requests over the limit get 429 Too Many Requests either way.
	RetryAfter time.Duration
	// Handler answers the admitted requests; nil answers 200 with a small
	// HTML page.
	Handler http.Handler
}

// Stats is what a Site has seen so far.
type Stats struct {
	Requests int // every request received
	OK       int // requests admitted and passed to the Handler
	TooMany  int // requests answered 429 Too Many Requests
	Banned   int // requests answered 403 Forbidden because of a ban
	Bans     int // clients banned
	// Peak is the largest number of requests, from all clients together,
	// that arrived in any closed interval of length Window (0 without a
	// Window).
	Peak int
	// Arrivals holds the arrival time of every request, in order.
	Arrivals []time.Time
}

// Site is an http.Handler playing a rate-limited target site; see the
// package doc. It is safe for concurrent use.
type Site struct {
	cfg        Config
	retryAfter string // the Retry-After value, "" for none
	now        func() time.Time

	mu       sync.Mutex
	stats    Stats
	recent   map[string][]time.Time // client -> its arrivals within Window
	banned   map[string]bool
	lastTrim time.Time
}

// New returns a Site for cfg. A positive Limit with a Window that is not
// positive panics, as that site could admit nothing.
func New(cfg Config) *Site {
	if cfg.Limit > 0 && cfg.Window <= 0 {
		panic("fakesite: a positive Limit needs a positive Window, got " + cfg.Window.String())
	}
	s := &Site{cfg: cfg, now: time.Now, recent: make(map[string][]time.Time), banned: make(map[string]bool)}
	if cfg.RetryAfter > 0 && !cfg.Ban {
		secs := (cfg.RetryAfter + time.Second - 1) / time.Second
		s.retryAfter = strconv.FormatInt(int64(secs), 10)
	}
	if s.cfg.Handler == nil {
		s.cfg.Handler = http.HandlerFunc(page)
	}
	return s
}

// verdict is what the site decided about one request.
type verdict int

const (
	admit verdict = iota
	tooMany
	forbidden
)

// ServeHTTP records the request and answers it: 403 if its client is banned
// or gets banned by it, 429 if it is over the limit, otherwise the Handler's
// answer.
func (s *Site) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch s.decide(clientOf(r)) {
	case forbidden:
		http.Error(w, "banned: too many requests", http.StatusForbidden)
	case tooMany:
		if s.retryAfter != "" {
			w.Header().Set("Retry-After", s.retryAfter)
		}
		http.Error(w, "too many requests", http.StatusTooManyRequests)
	default:
		s.cfg.Handler.ServeHTTP(w, r)
	}
}

// decide records one arrival from client and returns the verdict.
func (s *Site) decide(client string) verdict {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	s.stats.Requests++
	s.stats.Arrivals = append(s.stats.Arrivals, now)
	if s.banned[client] {
		s.stats.Banned++
		return forbidden
	}
	if s.cfg.Limit <= 0 {
		s.stats.OK++
		return admit
	}
	s.trim(now)
	log := append(dropOld(s.recent[client], now, s.cfg.Window), now)
	s.recent[client] = log
	switch {
	case len(log) <= s.cfg.Limit:
		s.stats.OK++
		return admit
	case s.cfg.Ban:
		s.banned[client] = true
		delete(s.recent, client)
		s.stats.Bans++
		s.stats.Banned++
		return forbidden
	default:
		s.stats.TooMany++
		return tooMany
	}
}

// trim forgets, at most once per Window, clients whose arrivals have all
// left the window, so a site seeing many clients stays small.
func (s *Site) trim(now time.Time) {
	if now.Sub(s.lastTrim) <= s.cfg.Window {
		return
	}
	s.lastTrim = now
	for c, log := range s.recent {
		if len(dropOld(log, now, s.cfg.Window)) == 0 {
			delete(s.recent, c)
		}
	}
}

// dropOld returns the arrivals in log, which is sorted, that lie within
// window of now.
func dropOld(log []time.Time, now time.Time, window time.Duration) []time.Time {
	i := 0
	for i < len(log) && now.Sub(log[i]) > window {
		i++
	}
	return log[i:]
}

// Stats returns a copy of what the site has seen so far.
func (s *Site) Stats() Stats {
	s.mu.Lock()
	st := s.stats
	st.Arrivals = slices.Clone(s.stats.Arrivals)
	s.mu.Unlock()
	if s.cfg.Window > 0 {
		st.Peak = Peak(st.Arrivals, s.cfg.Window)
	}
	return st
}

// clientOf returns the remote IP of r, or its whole RemoteAddr when that
// has no port.
func clientOf(r *http.Request) string {
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		return host
	}
	return r.RemoteAddr
}

func page(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_, _ = w.Write([]byte("<!doctype html><title>fakesite</title><p>" + http.StatusText(http.StatusOK) + "</p>\n"))
}
