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
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"
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
	raw    string   // the line's text, when it could not be parsed
	err    error
}

// readInput reads the CSV file at path: a header line that names
// codeColumn, then records with as many fields as the header. A record
// that cannot be parsed, or has another number of fields, is rejected
// alone (in.rejects) and reading goes on: after a record that cannot be
// parsed, from the line after its error, or, when a quote in it was most
// likely left open (it would otherwise take every line after it into one
// field), from the line after its first. A file without a usable header is an
// error.
func readInput(path string) (*input, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	// starts[i] is where line i+1 begins.
	starts := []int{0}
	for i, c := range data {
		if c == '\n' && i+1 < len(data) {
			starts = append(starts, i+1)
		}
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
			in.rejects = append(in.rejects, reject{line: line, raw: lineText(data, starts, line), err: perr.Err})
			// A quoted field that "closed" on a quote followed by more
			// than a comma or a line's end was most likely never closed:
			// reading goes on at the line after the record's first. Any
			// other error ends a record that did span its lines: reading
			// goes on after the line of the error.
			next := base + perr.Line
			if errors.Is(perr.Err, csv.ErrQuote) {
				next = line
			}
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
		if len(rec) != len(header) {
			in.rejects = append(in.rejects, reject{line: line, record: rec,
				err: fmt.Errorf("%d fields, want %d as in the header", len(rec), len(header))})
			continue
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

// lineText returns line n (from 1) of data, without its line ending, cut
// at 200 bytes.
func lineText(data []byte, starts []int, n int) string {
	if n < 1 || n > len(starts) {
		return ""
	}
	rest := data[starts[n-1]:]
	if i := bytes.IndexByte(rest, '\n'); i >= 0 {
		rest = rest[:i]
	}
	rest = bytes.TrimSuffix(rest, []byte("\r"))
	if len(rest) > 200 {
		return string(rest[:200]) + "…"
	}
	return string(rest)
}

// checkCode returns the API's spelling of a country code: two ASCII
// letters, upper-cased. Anything else is rejected before it costs a call.
func checkCode(code string) (string, error) {
	if len(code) != 2 || !isLetter(code[0]) || !isLetter(code[1]) {
		return "", fmt.Errorf("%s %q: want two letters (ISO 3166-1 alpha-2)", codeColumn, code)
	}
	return strings.ToUpper(code), nil
}

func isLetter(c byte) bool { return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }

// enricher looks countries up in the API.
type enricher struct {
	client  *http.Client // its transport bounds each attempt by timeout
	api     string       // the API's base URL, without a trailing slash
	timeout time.Duration
}

// lookup asks the API about one country code. Anything but a 200 with a
// JSON country (an object whose "name" and "region" are not empty, in a
// body of at most maxBody bytes) is an error naming the request; an
// attempt that ran out of time (e.timeout, after the transport's retries)
// also names -api-timeout.
func (e *enricher) lookup(ctx context.Context, code string) (country, error) {
	u := e.api + "/v1/countries/" + url.PathEscape(code)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return country{}, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := e.client.Do(req)
	if err != nil {
		if e.timedOut(ctx, err) {
			var ue *url.Error // "Get URL: ...": the URL is named below
			if errors.As(err, &ue) {
				err = ue.Err
			}
			return country{}, fmt.Errorf("GET %s: no answer within -api-timeout %v: %w", u, e.timeout, err)
		}
		return country{}, err // a *url.Error: it names the method and URL
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
		return country{}, fmt.Errorf("GET %s: the answer did not end within -api-timeout %v: %w", u, e.timeout, err)
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
// order too. Only ctx ending stops it early, with ctx's error: the calls
// still waiting on the quota give their slot back.
func enrich(ctx context.Context, in *input, e *enricher, workers int) ([][]string, []reject, error) {
	out := make([][]string, len(in.records))
	errs := make([]error, len(in.records))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(workers)
	for i, rec := range in.records {
		code, err := checkCode(rec[in.code])
		if err != nil {
			errs[i] = err
			continue
		}
		g.Go(func() error {
			c, err := e.lookup(gctx, code)
			if err != nil {
				if ctx.Err() != nil {
					return context.Cause(ctx)
				}
				errs[i] = err
				return nil
			}
			out[i] = append(slices.Clip(rec), c.Name, c.Region)
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, nil, err
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

// writeCSV writes header and records as CSV to the file at path, or to
// stdout when path is "" or "-". run calls it only once every record has
// been decided, so a run stopped early leaves an earlier file as it was.
func writeCSV(path string, stdout io.Writer, header []string, records [][]string) error {
	if path == "" || path == "-" {
		return writeRecords(stdout, header, records)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := writeRecords(f, header, records); err != nil {
		f.Close()
		return fmt.Errorf("%s: %w", path, err)
	}
	return f.Close()
}

func writeRecords(w io.Writer, header []string, records [][]string) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(header); err != nil {
		return err
	}
	return cw.WriteAll(records) // flushes, and reports any write error
}
