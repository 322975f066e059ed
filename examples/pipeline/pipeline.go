package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/fleetgate/fleetgate/backoff"
	"github.com/fleetgate/fleetgate/internal/secret"
	"github.com/fleetgate/fleetgate/transport"
)

// codeColumn names the input column the API is asked about.
const codeColumn = "country_code"

// enrichedColumns are appended to every record, in this order.
var enrichedColumns = []string{"country_name", "region"}

// maxBody bounds an API answer's body, in bytes: a longer answer is an
// error, not a country.
const (
	maxBody     = 1 << 20
	maxBodyText = "1 MiB"
)

// input is a CSV file in memory.
type input struct {
	header  []string
	records [][]string
	lines   []int // the line each record starts on, for messages
	code    int   // the index of codeColumn
	rejects []reject
}

// reject is a record left out of the output, and why.
type reject struct {
	line   int
	record []string // as read; nil when the line could not be parsed
	raw    string   // the input's text, in full, when record is nil or has the wrong number of fields
	err    error
}

// rejectColumns follow the input's columns in the -rejects file: the line
// a rejected record starts on, the reason, and the input's text when the
// record's fields cannot hold it (see reject.row).
var rejectColumns = []string{"rejected_line", "rejected_reason", "rejected_text"}

// row returns r as a line of the -rejects file, whose input columns are
// width: a record with width fields in those columns, as read, and an
// empty rejected_text; any other (a line that is not CSV, or a record
// with another number of fields) with empty input columns and its text
// in full, as it was in the input (several lines for a record that spans
// them), in rejected_text.
func (r reject) row(width int) []string {
	row := make([]string, width, width+len(rejectColumns))
	text := r.raw
	if len(r.record) == width {
		copy(row, r.record)
		text = ""
	}
	return append(row, strconv.Itoa(r.line), r.err.Error(), text)
}

// readInput reads the CSV file at path: a header line that names
// codeColumn, then records with as many fields as the header. A record
// that cannot be parsed, or has another number of fields, is rejected
// alone (in.rejects, with its text in full) and reading goes on: after a
// record that cannot be parsed, from the line after its error, or, when a
// quote in it was most likely left open (it would otherwise take every
// line after it into one field), from the line after its first. A file
// without a usable header is an error.
//
// A -rejects file can be read again once fixed: when the header ends with
// rejectColumns, those columns are dropped from it and from every record,
// except that a record whose rejected_text is not empty (its text never
// made it into the columns) is rejected again, with that text.
//
// A path of "-" reads stdin (os.Stdin when nil) to its end, named "stdin"
// in errors.
func readInput(path string, stdin io.Reader) (*input, error) {
	var data []byte
	var err error
	if path == "-" {
		path = "stdin"
		if stdin == nil {
			stdin = os.Stdin
		}
		data, err = io.ReadAll(stdin)
		if err != nil {
			err = fmt.Errorf("read stdin: %w", err)
		}
	} else {
		data, err = os.ReadFile(path)
	}
	if err != nil {
		return nil, err
	}
	// A byte order mark (spreadsheets' "CSV UTF-8") is not a part of the
	// first column's name.
	data = bytes.TrimPrefix(data, []byte("\ufeff"))
	// starts[i] is where line i+1 begins.
	starts := []int{0}
	for i, c := range data {
		if c == '\n' && i+1 < len(data) {
			starts = append(starts, i+1)
		}
	}
	// text returns data from the start of line (from 1) to end, as it is,
	// without the line ending at end.
	text := func(line, end int) string {
		b := bytes.TrimSuffix(data[starts[line-1]:end], []byte("\n"))
		return string(bytes.TrimSuffix(b, []byte("\r")))
	}
	// lineEnd returns where line n+1 begins, or data's end.
	lineEnd := func(n int) int {
		if n < len(starts) {
			return starts[n]
		}
		return len(data)
	}
	base := 0 // lines before the reader's start
	r := newCSVReader(data)
	header, err := r.Read()
	if errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s: empty, want a header line", path)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	width, rejected := len(header), false // the fields a record has; a -rejects file?
	if n := len(header) - len(rejectColumns); n > 0 && slices.Equal(header[n:], rejectColumns) {
		header, rejected = header[:n], true
	}
	in := &input{header: header, code: slices.Index(header, codeColumn)}
	if in.code < 0 {
		return nil, fmt.Errorf("%s: no %q column in the header %q", path, codeColumn, header)
	}
	for {
		rec, err := r.Read()
		if errors.Is(err, io.EOF) {
			return in, nil
		}
		var perr *csv.ParseError
		switch {
		case errors.As(err, &perr):
			line := base + perr.StartLine
			// A quoted field that "closed" on a quote followed by more
			// than a comma or a line's end was most likely never closed:
			// reading goes on at the line after the record's first. Any
			// other error ends a record that did span its lines: reading
			// goes on after the line of the error.
			next := base + perr.Line
			if errors.Is(perr.Err, csv.ErrQuote) {
				next = line
			}
			in.rejects = append(in.rejects, reject{line: line, raw: text(line, lineEnd(next)), err: perr.Err})
			if next >= len(starts) {
				return in, nil
			}
			base = next
			r = newCSVReader(data[starts[next]:])
			continue
		case err != nil:
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		line, _ := r.FieldPos(0)
		line += base
		if len(rec) != width {
			end := starts[base] + int(r.InputOffset())
			in.rejects = append(in.rejects, reject{line: line, record: rec, raw: text(line, end),
				err: fmt.Errorf("%d fields, want %d as in the header", len(rec), width)})
			continue
		}
		if rejected {
			raw := rec[len(header)+2]
			rec = rec[:len(header)]
			if raw != "" {
				in.rejects = append(in.rejects, reject{line: line, raw: raw,
					err: errors.New("rejected_text is not empty: put its fields in the columns, then empty it")})
				continue
			}
		}
		in.records = append(in.records, rec)
		in.lines = append(in.lines, line)
	}
}

func newCSVReader(data []byte) *csv.Reader {
	r := csv.NewReader(bytes.NewReader(data))
	r.FieldsPerRecord = -1 // checked record by record
	return r
}

// shorten returns s cut at 200 bytes, for a message.
func shorten(s string) string {
	if len(s) > 200 {
		return s[:200] + "…"
	}
	return s
}

// checkCode returns the API's spelling of a country code: two ASCII
// letters, upper-cased. Anything else is rejected before it costs a call,
// with a reason that quotes it cut at 200 bytes (the record itself keeps
// it whole).
func checkCode(code string) (string, error) {
	if len(code) != 2 || !isLetter(code[0]) || !isLetter(code[1]) {
		return "", fmt.Errorf("%s %q: want two letters (ISO 3166-1 alpha-2)", codeColumn, shorten(code))
	}
	return strings.ToUpper(code), nil
}

func isLetter(c byte) bool { return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }

// enricher looks countries up in the API.
type enricher struct {
	// clients[i] makes at most i+1 attempts of a call; their transports
	// bound each attempt by timeout.
	clients [transport.DefaultAttempts]*http.Client
	api     *url.URL // the API's base URL: a call's path goes after its path, its query is kept
	timeout time.Duration
	backoff backoff.Exponential // between calls whose body broke off
}

// lookup asks the API about one country code. Anything but a 200 with a
// JSON country (an object whose "name" and "region" are not empty, in a
// body of at most maxBody bytes) is an error naming the request, "GET URL:
// " and the cause, wrapped; an attempt that ran out of time (e.timeout,
// after the retries) also names -api-timeout. No error shows the password
// of e.api, nor its query's values: the URL is shown as shownURL does.
//
// The transport retries an attempt that fails before its answer's headers;
// lookup retries one whose body breaks off after them (cut short, reset,
// or past -api-timeout), after a backoff delay, each time through the
// transport and so the quota. A code costs at most transport.DefaultAttempts
// requests written to the API in all: each call goes through the client
// with the attempts left.
func (e *enricher) lookup(ctx context.Context, code string) (country, error) {
	var sent atomic.Int64
	actx := context.WithValue(ctx, sentKey{}, &sent)
	var delay time.Duration
	for retry := 0; ; retry++ {
		c, err := e.lookupOnce(actx, e.clients[max(transport.DefaultAttempts-sent.Load(), 1)-1], code)
		if _, broke := errors.AsType[*brokenBody](err); !broke || sent.Load() >= transport.DefaultAttempts {
			return c, err
		}
		delay = e.backoff.Delay(retry, delay)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return c, err
		case <-t.C:
		}
	}
}

// shownURL returns u for a message: its password shown as "xxxxx", as
// secret.Redacted shows it (a user without one too: a token), and every
// value of its query too, where an API key most often is (a part without
// a '=' is all value: "?KEY").
func shownURL(u *url.URL) string {
	if u.RawQuery == "" {
		return secret.Redacted(u)
	}
	c := *u
	parts := strings.Split(c.RawQuery, "&")
	for i, p := range parts {
		if k, _, ok := strings.Cut(p, "="); ok {
			parts[i] = k + "=xxxxx"
		} else if p != "" {
			parts[i] = "xxxxx"
		}
	}
	c.RawQuery = strings.Join(parts, "&")
	return secret.Redacted(&c)
}

// brokenBody is the error of an answer whose body broke off: lookup makes
// the call again.
type brokenBody struct{ error }

func (b *brokenBody) Unwrap() error { return b.error }

// sentKey is the context key of a call's count of requests written to the
// API (an *atomic.Int64), which countingTransport adds to.
type sentKey struct{}

// lookupOnce makes one call of lookup, through the transport.
func (e *enricher) lookupOnce(ctx context.Context, client *http.Client, code string) (country, error) {
	call := e.api.JoinPath("v1", "countries", code) // the base's escapes kept
	call.Fragment, call.RawFragment = "", ""
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, call.String(), nil)
	if err != nil { // url.Parse's error quotes the URL, password and all
		return country{}, fmt.Errorf("GET -api/v1/countries/%s: not a URL: %s", code, secret.URLError(err, "http:// or https://"))
	}
	u := shownURL(req.URL) // the URL in every error below
	req.Header.Set("Accept", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		// A *url.Error, `Get "URL": ...`, its URL with the password as
		// "***": every error names the URL as the others do.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		if e.timedOut(ctx, err) {
			return country{}, fmt.Errorf("GET %s: no answer within -api-timeout %v: %w", u, e.timeout, err)
		}
		return country{}, fmt.Errorf("GET %s: %w", u, err)
	}
	defer func() {
		// Read to the end so the connection is reused.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxBody))
		resp.Body.Close()
	}()
	if resp.StatusCode != http.StatusOK {
		return country{}, fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	if resp.ContentLength > maxBody {
		return country{}, fmt.Errorf("GET %s: the answer is over the %s limit (%d bytes)", u, maxBodyText, resp.ContentLength)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	switch {
	case err != nil && e.timedOut(ctx, err):
		return country{}, &brokenBody{fmt.Errorf("GET %s: the answer did not end within -api-timeout %v: %w", u, e.timeout, err)}
	case err != nil && ctx.Err() == nil:
		return country{}, &brokenBody{fmt.Errorf("GET %s: read the answer: %w", u, err)}
	case err != nil:
		return country{}, fmt.Errorf("GET %s: read the answer: %w", u, err)
	case len(body) > maxBody:
		return country{}, fmt.Errorf("GET %s: the answer is over the %s limit", u, maxBodyText)
	}
	var c country
	if err := json.Unmarshal(body, &c); err != nil {
		return country{}, fmt.Errorf("GET %s: decode the answer: %w", u, err)
	}
	if missing := c.missing(); missing != "" {
		return country{}, fmt.Errorf("GET %s: the answer is not a country: %s", u, missing)
	}
	return c, nil
}

// missing names the fields of c that an enriched record needs and that
// are empty (or only spaces), or returns "" when there are none.
func (c country) missing() string {
	var names []string
	if strings.TrimSpace(c.Name) == "" {
		names = append(names, `"name"`)
	}
	if strings.TrimSpace(c.Region) == "" {
		names = append(names, `"region"`)
	}
	switch len(names) {
	case 0:
		return ""
	case 1:
		return names[0] + " is empty or missing"
	}
	return strings.Join(names, " and ") + " are empty or missing"
}

// timedOut reports whether err is an attempt's deadline (-api-timeout)
// rather than ctx's end.
func (e *enricher) timedOut(ctx context.Context, err error) bool {
	return ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded)
}

// enrich looks up every record's code, with at most workers calls in
// flight, and returns the records with enrichedColumns appended, in input
// order, and the records it rejected (a bad code, or a call that failed
// for good: the transport has retried what is worth retrying), in input
// order too. Only ctx ending stops it early, with an error that wraps
// context.Cause(ctx) (naming the signal when it is a *signalError): the
// calls still waiting on the quota give their slot back.
func enrich(ctx context.Context, in *input, e *enricher, workers int) ([][]string, []reject, error) {
	out := make([][]string, len(in.records))
	errs := make([]error, len(in.records))
	var decided atomic.Int64 // records enriched or rejected, for the interruption's message
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(workers)
	for i, rec := range in.records {
		code, err := checkCode(rec[in.code])
		if err != nil {
			errs[i] = err
			decided.Add(1)
			continue
		}
		g.Go(func() error {
			c, err := e.lookup(gctx, code)
			if err != nil {
				if ctx.Err() != nil {
					return context.Cause(ctx)
				}
				errs[i] = err
				decided.Add(1)
				return nil
			}
			out[i] = append(slices.Clip(rec), c.Name, c.Region)
			decided.Add(1)
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		const kept = "nothing written (an earlier -out or -rejects is left as it was)"
		if sig := (*signalError)(nil); errors.As(err, &sig) { // "interrupted by SIGTERM after ..."
			return nil, nil, fmt.Errorf("%w after %d of %d records, %s", err, decided.Load(), len(in.records), kept)
		}
		return nil, nil, fmt.Errorf("interrupted after %d of %d records, %s: %w", decided.Load(), len(in.records), kept, err)
	}
	var good [][]string
	var rejects []reject
	for i, rec := range in.records {
		if errs[i] != nil {
			rejects = append(rejects, reject{line: in.lines[i], record: rec, err: errs[i]})
			continue
		}
		good = append(good, out[i])
	}
	return good, rejects, nil
}

// writeRecords writes header and records to w as CSV.
func writeRecords(w io.Writer, header []string, records [][]string) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(header); err != nil {
		return err
	}
	return cw.WriteAll(records) // flushes, and reports any write error
}

// countingTransport counts in wrote the requests written to the API:
// net/http sends a request again, on a fresh connection, when a reused one
// was closed before any answer, and each such write reaches the API (and
// pays the quota: the transport above books it again). A dial that failed
// writes nothing.
type countingTransport struct {
	base  http.RoundTripper
	wrote *atomic.Int64
}

// RoundTrip sends req through the base transport, counting its writes.
func (t *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	sent, _ := req.Context().Value(sentKey{}).(*atomic.Int64)
	trace := &httptrace.ClientTrace{WroteRequest: func(w httptrace.WroteRequestInfo) {
		if w.Err == nil {
			t.wrote.Add(1)
			if sent != nil {
				sent.Add(1)
			}
		}
	}}
	return t.base.RoundTrip(req.WithContext(httptrace.WithClientTrace(req.Context(), trace)))
}
