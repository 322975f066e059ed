package main

import (
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

	"golang.org/x/sync/errgroup"
)

// codeColumn names the input column the API is asked about.
const codeColumn = "country_code"

// enrichedColumns are appended to every record, in this order.
var enrichedColumns = []string{"country_name", "region"}

// maxBody bounds how much of an API response is read.
const maxBody = 1 << 20

// input is a CSV file in memory.
type input struct {
	header  []string
	records [][]string
	lines   []int // the line each record starts on, for messages
	code    int   // the index of codeColumn
}

// readInput reads the CSV file at path: a header line that names
// codeColumn, then records with as many fields as the header.
func readInput(path string) (*input, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := csv.NewReader(f)
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
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		line, _ := r.FieldPos(0)
		in.records = append(in.records, rec)
		in.lines = append(in.lines, line)
	}
}

// enricher looks countries up in the API.
type enricher struct {
	client *http.Client
	api    string // the API's base URL, without a trailing slash
}

// lookup asks the API about one country code. Anything but a 200 with a
// JSON country is an error naming the request.
func (e *enricher) lookup(ctx context.Context, code string) (country, error) {
	u := e.api + "/v1/countries/" + url.PathEscape(code)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return country{}, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := e.client.Do(req)
	if err != nil {
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
	var c country
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxBody)).Decode(&c); err != nil {
		return country{}, fmt.Errorf("GET %s: decode the answer: %w", u, err)
	}
	return c, nil
}

// enrich looks up every record's code, with at most workers calls in
// flight, and returns the records with enrichedColumns appended, in input
// order. The first failure cancels the other calls (those still waiting
// on the quota give their slot back) and is returned, naming its line.
func enrich(ctx context.Context, in *input, e *enricher, workers int) ([][]string, error) {
	out := make([][]string, len(in.records))
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(workers)
	for i, rec := range in.records {
		g.Go(func() error {
			c, err := e.lookup(ctx, rec[in.code])
			if err != nil {
				return fmt.Errorf("line %d: %w", in.lines[i], err)
			}
			out[i] = append(slices.Clip(rec), c.Name, c.Region)
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return out, nil
}

// writeOutput writes header, with enrichedColumns appended, and records as
// CSV to the file at path, or to stdout when path is "" or "-". run calls
// it only once every record is enriched, so a failed run leaves an earlier
// output file as it was.
func writeOutput(path string, stdout io.Writer, header []string, records [][]string) error {
	if path == "" || path == "-" {
		return writeCSV(stdout, header, records)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := writeCSV(f, header, records); err != nil {
		f.Close()
		return fmt.Errorf("%s: %w", path, err)
	}
	return f.Close()
}

func writeCSV(w io.Writer, header []string, records [][]string) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(append(slices.Clip(header), enrichedColumns...)); err != nil {
		return err
	}
	return cw.WriteAll(records) // flushes, and reports any write error
}
