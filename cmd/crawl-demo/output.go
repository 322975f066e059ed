package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/fleetgate/fleetgate/internal/fakesite"
	"github.com/fleetgate/fleetgate/internal/secret"
)

// result is one line of the crawler's output. The field order is the
// output's key order, which scripts rely on.
type result struct {
	URL      string `json:"url"`
	Status   int    `json:"status"`   // 0 when no response came
	Attempts int    `json:"attempts"` // requests written to the target: retries, redirects and net/http's own resends included; a dial that failed is none
	Error    string `json:"error"`    // "" on success
}

// ok reports whether r is a success: a response below 400 and no error.
func (r result) ok() bool { return r.Error == "" && r.Status > 0 && r.Status < 400 }

// lineWriter writes results as JSON Lines, one Write per line, so a line is
// never split even if the process is killed.
type lineWriter struct {
	enc *json.Encoder
}

func newLineWriter(w io.Writer) *lineWriter {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false) // keep & < > in URLs readable
	return &lineWriter{enc: enc}
}

// write writes r as one line, with the password of its URL, if any, and
// of every URL in its error (a copy of the URL, or a redirect's Location
// that net/http quotes) shown as "xxxxx", even when the URL does not parse,
// and bytes that are not UTF-8 percent-encoded.
func (lw *lineWriter) write(r result) error {
	if safe := escapeInvalid(hidePassword(r.URL)); safe != r.URL {
		r.Error = strings.ReplaceAll(r.Error, r.URL, safe)
		r.URL = safe
	}
	r.Error = escapeInvalid(hideErrorPasswords(r.Error))
	if err := lw.enc.Encode(r); err != nil {
		return fmt.Errorf("write result for %q: %w", r.URL, err)
	}
	return nil
}

// siteReport is one target's row in the demo's table.
type siteReport struct {
	Target   string        // the quota's target (throttle.Normalize, grouped by -key), not the URL's host:port
	Requests int           // requests the site received (or this process wrote to it)
	OK       int           // 2xx
	TooMany  int           // 429
	Banned   int           // 403 answers
	Bans     int           // clients banned; -1 when unknown
	Peak     int           // most requests in any closed interval of Window
	Limit    int           // the site's limit per Window
	Window   time.Duration // the site's window
	Rate     float64       // achieved rate, requests per second over whole windows: see achievedRate
	Span     time.Duration // from the first request to the last
	Elapsed  time.Duration // the run's time
}

// siteReportOf returns the row of target for what the demo's site saw.
func siteReportOf(target string, st fakesite.Stats, elapsed time.Duration) siteReport {
	rep := newSiteReport(target, st.Arrivals, st.Peak, demoLimit, demoWindow, elapsed)
	rep.OK, rep.TooMany, rep.Banned, rep.Bans = st.OK, st.TooMany, st.Banned, st.Bans
	rep.Requests = st.Requests // the site's own count
	return rep
}

// newSiteReport returns the row of target for arrivals, the times its
// requests arrived (or were written) in any order, peak the most of them
// in any window, under a limit of limit per window: Requests, Peak, Rate
// and Span are theirs; the caller fills in the answers.
func newSiteReport(target string, arrivals []time.Time, peak, limit int, window, elapsed time.Duration) siteReport {
	_, end := bounds(arrivals)
	return siteReport{Target: target, Requests: len(arrivals), Bans: -1, Peak: peak, Limit: limit, Window: window,
		Rate: achievedRate(arrivals, window, end), Span: span(arrivals), Elapsed: elapsed}
}

// achievedRate returns the rate, in requests per second, that arrivals
// (in any order) achieved up to end, measured over whole windows: the
// arrivals of the k whole windows from the first arrival to end, divided
// by k windows; when end is less than a window after the first (k = 0),
// all the arrivals over one window, the unit the limit is counted in. The
// arrivals of the last, unfinished window (less than one window's worth)
// are left out; so are any after end. It is 0 without arrivals.
//
// Each whole window is a half-open interval of the window's length, so it
// holds at most the peak of any closed one: the figure never exceeds
// peak/window, nor the limit for a run that kept it. Dividing n arrivals
// by the time from the first to the last would overstate it: they span
// n-1 intervals (20 paced 50ms apart span 950ms: 21/s against 20 per 1s),
// and a burst at a window's start says nothing of the rate (two bursts of
// 20, 1.05s apart: 38/s), which no formula over the span alone avoids.
func achievedRate(arrivals []time.Time, window time.Duration, end time.Time) float64 {
	if len(arrivals) == 0 || window <= 0 {
		return 0
	}
	first, _ := bounds(arrivals)
	k := end.Sub(first) / window
	if k <= 0 {
		n := 0
		for _, t := range arrivals {
			if !t.After(end) {
				n++
			}
		}
		return float64(n) / window.Seconds()
	}
	stop := first.Add(k * window)
	n := 0
	for _, t := range arrivals {
		if t.Before(stop) {
			n++
		}
	}
	return float64(n) / (time.Duration(k) * window).Seconds()
}

// maxAllowed returns how many requests the limit allows within Span: a
// sliding window of Limit per Window admits Limit×(⌊Span/Window⌋+1), which
// is why a short run can average more than Limit/Window.
func (r siteReport) maxAllowed() int {
	return r.Limit * (int(r.Span/r.Window) + 1)
}

// writeTable prints reports as an aligned table.
func writeTable(w io.Writer, reports []siteReport) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "target\trequests\t2xx\t429\t403\tbans\tpeak in any window\trate (limit)\tof the most allowed\ttime")
	for _, r := range reports {
		bans := "?"
		if r.Bans >= 0 {
			bans = fmt.Sprint(r.Bans)
		}
		limitRate := float64(r.Limit) / r.Window.Seconds()
		used := 100 * float64(r.Requests) / float64(r.maxAllowed())
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\t%d of %d per %v\t%.1f/s (%.1f/s)\t%.0f%% of %d in %v\t%v\n",
			r.Target, r.Requests, r.OK, r.TooMany, r.Banned, bans,
			r.Peak, r.Limit, r.Window, r.Rate, limitRate,
			used, r.maxAllowed(), r.Span.Round(10*time.Millisecond), r.Elapsed.Round(10*time.Millisecond))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	return nil
}

// hidePassword returns raw with the password of its user, if any, shown as
// "xxxxx", as url.URL.Redacted does, or its user when it has no password
// (most often a token: "https://TOKEN@host/"), and so are those of URLs
// inside it (a redirect target in its query, say; see hideNestedPasswords).
// A line that does not parse as a URL (a bad escape, a space in the host, a
// '#' or '/' in the password) can still carry one: everything between the
// first ':' after "://" and the last '@' is taken for a password (with no
// ':' before the first '@', everything between "://" and the last '@' for
// a token), which may hide more than one, never less.
func hidePassword(raw string) string {
	return hideEncodedPasswords(hideNestedPasswords(hideUserPassword(raw)))
}

// hideErrorPasswords returns the error text msg with every URL in it
// passed through hidePassword: each Go-quoted string that holds one (%q
// and url.Error quote a URL so), whatever characters its password has,
// and each word, between white space and quotes, that holds one.
func hideErrorPasswords(msg string) string {
	if !hasURL(msg) {
		return msg
	}
	var b strings.Builder
	for len(msg) > 0 {
		if msg[0] == '"' {
			if q, err := strconv.QuotedPrefix(msg); err == nil {
				msg = msg[len(q):]
				if s, _ := strconv.Unquote(q); hasURL(s) { // QuotedPrefix's answer unquotes
					if safe := hidePassword(s); safe != s {
						q = strconv.Quote(safe)
					}
				}
				b.WriteString(q)
				continue
			}
		}
		const sep = " \t\r\n\""
		if strings.IndexByte(sep, msg[0]) >= 0 {
			b.WriteByte(msg[0])
			msg = msg[1:]
			continue
		}
		end := strings.IndexAny(msg, sep)
		if end < 0 {
			end = len(msg)
		}
		if word := msg[:end]; hasURL(word) {
			b.WriteString(hidePassword(word))
		} else {
			b.WriteString(word)
		}
		msg = msg[end:]
	}
	return b.String()
}

// hasURL reports whether s may hold a URL: "://", or "%3A%2F%2F" in any
// case.
func hasURL(s string) bool {
	return strings.Contains(s, "://") || strings.Contains(asciiLower(s), "%3a%2f%2f")
}

// hideEncodedPasswords shows as "xxxxx" the password of every URL inside s
// written percent-encoded, as a query value carries one:
// "%3A%2F%2Fuser%3Apassword%40", the password between the first "%3A" and
// the last "%40" before the next '/', '?', '#', '&', "%2F", "%3F" or "%23";
// without a "%3A" before that "%40", the user, a token.
func hideEncodedPasswords(s string) string {
	const sep = "%3a%2f%2f" // "://"
	lower := asciiLower(s)  // the same length as s: its indexes cut s
	if !strings.Contains(lower, sep) {
		return s
	}
	var b strings.Builder
	at := 0 // s[:at] is written
	for {
		i := strings.Index(lower[at:], sep)
		if i < 0 {
			b.WriteString(s[at:])
			return b.String()
		}
		start := at + i + len(sep)
		end := len(s)
		for _, stop := range []string{"/", "?", "#", "&", "%2f", "%3f", "%23"} {
			if j := strings.Index(lower[start:], stop); j >= 0 && start+j < end {
				end = start + j
			}
		}
		auth := lower[start:end]
		colon, atSign := strings.Index(auth, "%3a"), strings.LastIndex(auth, "%40")
		b.WriteString(s[at:start])
		if colon >= 0 && colon+3 < atSign {
			b.WriteString(s[start : start+colon+3])
			b.WriteString("xxxxx")
			b.WriteString(s[start+atSign : end])
		} else if atSign >= 0 { // a user alone
			b.WriteString("xxxxx")
			b.WriteString(s[start+atSign : end])
		} else {
			b.WriteString(s[start:end])
		}
		at = end
	}
}

// hideNestedPasswords shows as "xxxxx" the password of every URL after the
// first in s: each "://" followed by "user:password@" before the next '/',
// '?', '#' or '&'; the user of one followed by "user@" or "user:@" (a
// token).
func hideNestedPasswords(s string) string {
	first := strings.Index(s, "://")
	if first < 0 || !strings.Contains(s[first+3:], "://") {
		return s
	}
	var b strings.Builder
	b.WriteString(s[:first+3])
	rest := s[first+3:]
	for {
		i := strings.Index(rest, "://")
		if i < 0 {
			b.WriteString(rest)
			return b.String()
		}
		b.WriteString(rest[:i+3])
		rest = rest[i+3:]
		end := strings.IndexAny(rest, "/?#&")
		if end < 0 {
			end = len(rest)
		}
		auth := rest[:end]
		at, colon := strings.LastIndexByte(auth, '@'), strings.IndexByte(auth, ':')
		if colon >= 0 && colon+1 < at {
			auth = auth[:colon+1] + "xxxxx" + auth[at:]
		} else if at >= 0 { // a user alone, or with an empty password
			auth = "xxxxx" + auth[at:]
		}
		b.WriteString(auth)
		rest = rest[end:]
	}
}

// asciiLower returns s with its ASCII letters lower-cased and every other
// byte as it is, so that an index into it is an index into s
// (strings.ToLower changes the length of invalid UTF-8 and of some
// letters).
func asciiLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// escapeInvalid returns s with every byte that is not part of valid UTF-8
// percent-encoded, as a URL carries it (and as net/url sends it): JSON
// would turn each into U+FFFD, and the line would no longer name its URL.
func escapeInvalid(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			fmt.Fprintf(&b, "%%%02X", s[i])
		} else {
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// hideUserPassword is hidePassword for the URL raw itself.
func hideUserPassword(raw string) string {
	// "u:pw@host" parses as scheme u, opaque "pw@host"; "token@host/x" as a
	// path: both are taken apart below.
	if u, err := url.Parse(raw); err == nil && u.Opaque == "" && (u.Scheme != "" || u.Host != "") {
		if u.User != nil {
			return secret.Redacted(u)
		}
		return raw
	}
	start := 0
	if i := strings.Index(raw, "://"); i >= 0 {
		start = i + len("://")
	}
	auth := raw[start:]
	at := strings.LastIndexByte(auth, '@')
	if at < 0 {
		return raw
	}
	colon := strings.IndexByte(auth[:at], ':')
	if colon < 0 || strings.IndexByte(auth, '@') < colon || colon+1 == at {
		// A user alone (a token, most often), whatever ':' a port or a
		// path puts after its '@', or with an empty password.
		return raw[:start] + "xxxxx" + raw[start+at:]
	}
	return raw[:start+colon+1] + "xxxxx" + raw[start+at:]
}
