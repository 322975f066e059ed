package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fleetgate/fleetgate/internal/secret"
	"github.com/fleetgate/fleetgate/throttle"
	"github.com/fleetgate/fleetgate/transport"
)

// maxBody bounds how much of a response body is read: a longer one is
// dropped there, and its line says so.
const maxBody = 32 << 20

// userAgent names the crawler to the sites it visits.
const userAgent = "fleetgate-crawl-demo/1 (+https://github.com/fleetgate/fleetgate)"

// interrupted is the error of every URL that was read but not fetched
// because the run was interrupted; a rerun can select them by it.
const interrupted = "interrupted: not fetched"

// sendsKey is the context key of a request's *atomic.Int32 send counter.
type sendsKey struct{}

// observer sees what reached the target: wrote is called for each request
// written to a connection, with the time its write ended (a dial that
// failed writes nothing), answered with each response's status. Both may
// be called from several goroutines at once.
type observer interface {
	wrote(at time.Time)
	answered(status int)
}

// attemptTransport is the base RoundTripper under the throttled transport,
// so it sees each attempt once it is allowed to go (and bounded by
// -timeout, transport.WithAttemptTimeout). It counts each time the request
// is written to a connection in the request's send counter, if any (a dial
// that fails sends nothing), and reports each such write and each response
// to obs, if set.
type attemptTransport struct {
	base http.RoundTripper
	obs  observer // nil: none
}

// RoundTrip sends one attempt.
func (t *attemptTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	n, _ := req.Context().Value(sendsKey{}).(*atomic.Int32)
	if n != nil || t.obs != nil {
		// net/http sends a request again, on another connection, when a
		// reused one fails before the response: each write is a send.
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{WroteRequest: func(w httptrace.WroteRequestInfo) {
			if w.Err != nil {
				return
			}
			if n != nil {
				n.Add(1)
			}
			if t.obs != nil {
				t.obs.wrote(time.Now())
			}
		}}))
	}
	resp, err := t.base.RoundTrip(req)
	if err == nil && t.obs != nil {
		t.obs.answered(resp.StatusCode)
	}
	return resp, err
}

// fleetClient is an http.Client that waits on a Throttler before every
// attempt, and the connection pool under it.
type fleetClient struct {
	*http.Client
	base    *http.Transport
	timeout time.Duration // -timeout, each attempt's bound
}

// newFleetClient returns a client whose requests go through the throttled
// transport with the command line's retries and per-attempt timeout. obs,
// if not nil, sees every request that reaches a target and every response.
// Log lines about a request name the target its quota is keyed on (the
// transport's do too), then its URL or host:port.
func newFleetClient(cfg *config, thr *throttle.Throttler, log *slog.Logger, obs observer) *fleetClient {
	base := http.DefaultTransport.(*http.Transport).Clone()
	base.MaxIdleConnsPerHost = cfg.workers
	rt := transport.New(&attemptTransport{base: base, obs: obs}, thr,
		transport.WithRetries(cfg.retries+1),
		transport.WithAttemptTimeout(cfg.timeout),
		transport.WithLogger(log),
		transport.OnAttempt(func(a transport.AttemptInfo) {
			if a.Err == nil && a.Status < 400 && a.Pause == 0 {
				return
			}
			// A pause the target asks for is logged by the Throttler, at
			// Info, once per pause; this line, with -v, names the
			// attempt's URL.
			ctx := a.Request.Context()
			if !log.Enabled(ctx, slog.LevelDebug) {
				return
			}
			var attrs []any
			if name, ok := targetOf(ctx, thr, a.Request.URL.Host); ok {
				attrs = append(attrs, "target", name)
			}
			attrs = append(attrs, "url", hidePassword(a.Request.URL.String()), "attempt", a.Attempt, "status", a.Status,
				"waited", a.Waited.Round(time.Millisecond), "pause", a.Pause)
			if a.Err != nil {
				attrs = append(attrs, "error", a.Err)
			}
			log.DebugContext(ctx, "attempt", attrs...)
		}))
	return &fleetClient{Client: &http.Client{Transport: rt}, base: base, timeout: cfg.timeout}
}

// close drops the client's idle connections.
func (c *fleetClient) close() { c.base.CloseIdleConnections() }

// fetch gets rawURL, which checkURL accepted, reads its body and returns
// its line. ctx ending (the run was interrupted) gives the interrupted
// error unless a whole response came first.
func fetch(ctx context.Context, c *fleetClient, rawURL string) result {
	res := result{URL: rawURL}
	var sends atomic.Int32
	req, err := http.NewRequestWithContext(context.WithValue(ctx, sendsKey{}, &sends), http.MethodGet, rawURL, nil)
	if err != nil {
		res.Error = err.Error()
		return res
	}
	req.Header.Set("User-Agent", userAgent)
	resp, err := c.Do(req)
	res.Attempts = int(sends.Load())
	if err != nil {
		res.Error = describe(ctx, err)
		if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			res.Error += fmt.Sprintf(" (no answer within -timeout %v)", c.timeout)
		}
		return res
	}
	n, err := io.Copy(io.Discard, io.LimitReader(resp.Body, maxBody+1))
	resp.Body.Close()
	res.Status, res.Attempts = resp.StatusCode, int(sends.Load())
	switch {
	case err != nil && ctx.Err() != nil:
		res.Status, res.Error = 0, interrupted
	case errors.Is(err, context.DeadlineExceeded):
		res.Error = fmt.Sprintf("read body: the answer did not end within -timeout %v", c.timeout)
	case err != nil:
		res.Error = "read body: " + err.Error()
	case n > maxBody:
		res.Error = fmt.Sprintf("read body: longer than %d MiB, the rest not read", maxBody>>20)
	case resp.StatusCode >= 400:
		res.Error = "HTTP " + resp.Status
	}
	return res
}

// describe turns a failed request's error into its line's error: without
// the *url.Error prefix, which repeats the URL, and interrupted when ctx
// ended. A redirect's Location that does not parse is told why in words
// that quote none of it (see badLocation).
func describe(ctx context.Context, err error) string {
	if ctx.Err() != nil {
		return interrupted
	}
	if ue, ok := errors.AsType[*url.Error](err); ok {
		return badLocation(ue.Err.Error())
	}
	return err.Error()
}

// locationPrefix starts net/http's error for a redirect whose Location
// does not parse: the Location follows, quoted, then url.Parse's error.
const locationPrefix = "failed to parse Location header "

// badLocation returns msg, net/http's error for a redirect whose Location
// does not parse, with url.Parse's reason, which quotes the part that
// failed (a bad escape, or the "port" of a password with a '/'), said as
// secret.URLError says it; any other msg as it is. The Location itself is
// left quoted in full: lineWriter.write hides its password.
func badLocation(msg string) string {
	rest, ok := strings.CutPrefix(msg, locationPrefix)
	if !ok {
		return msg
	}
	q, err := strconv.QuotedPrefix(rest)
	if err != nil {
		return msg
	}
	loc, _ := strconv.Unquote(q) // QuotedPrefix's answer unquotes
	if _, err := url.Parse(loc); err != nil {
		return locationPrefix + q + ": " + secret.URLError(err, "http:// or https://")
	}
	return msg
}

// checkURL reports why s is not an absolute http or https URL with a host,
// or returns that host, lower-cased.
func checkURL(s string) (host string, err error) {
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return "", fmt.Errorf("not a URL: %s", secret.URLError(err, "http:// or https://"))
	case u.Scheme != "http" && u.Scheme != "https":
		if u.Scheme == "" {
			return "", errors.New("not an absolute URL: want http:// or https://")
		}
		return "", fmt.Errorf("scheme %q: want http or https", u.Scheme)
	case u.Hostname() == "":
		return "", errors.New("no host")
	}
	return strings.ToLower(u.Hostname()), nil
}

// targetOf returns the name of the quota host counts against (thr.Target:
// the host normalised by throttle.Normalize, lower case and without its
// port, then grouped as -key says), and whether it has one.
func targetOf(ctx context.Context, thr *throttle.Throttler, host string) (string, bool) {
	name, _, err := thr.Target(ctx, host)
	return name, err == nil
}
