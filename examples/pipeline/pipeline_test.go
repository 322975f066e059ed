package main

import (
	"bytes"
	"encoding/csv"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetgate/fleetgate/internal/redistest"
	"github.com/fleetgate/fleetgate/throttle"
)

// The fake API's limit in the fleet tests is strict and short, so that 40
// records take several windows. The quota gives it 100ms of headroom on
// top of the throttle's margin: on a loaded machine, under -race, a
// request can reach the API more than DefaultMargin after its slot.
const (
	testLimit  = 10
	testWindow = 500 * time.Millisecond
	testRule   = "10/600ms"
)

// A run on the embedded store enriches every record, in order, and keeps
// the API under its limit: not one 429.
func TestRunKeepsTheAPIUnderItsLimit(t *testing.T) {
	t.Parallel()
	api := startTestAPI(t, testLimit, testWindow)
	in, records := writeInput(t, 40)
	out := filepath.Join(t.TempDir(), "out.csv")
	var stderr lockedBuffer

	err := run(t.Context(), config{in: in, out: out, api: api.URL, rule: testRule, margin: throttle.DefaultMargin, timeout: defaultAPITimeout, workers: 8}, io.Discard, &stderr)
	require.NoError(t, err, stderr.String())

	requireEnriched(t, records, readCSV(t, out))
	requireUnderLimit(t, api, 40)
	require.Contains(t, stderr.String(), "pipeline: 40 records: 40 enriched, 0 rejected; 40 API calls, 0 answered 429, ")
}

// Two copies of the job with REDIS_URL set, each with its own throttler
// and Redis client, share one quota: together they keep the API under its
// limit, which each alone would exceed.
func TestCopiesShareTheQuotaThroughRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	api := startTestAPI(t, testLimit, testWindow)
	in, records := writeInput(t, 40)
	dir := t.TempDir()

	var wg sync.WaitGroup
	errs := make([]error, 2)
	stderrs := make([]lockedBuffer, 2)
	for i := range 2 {
		cfg := config{in: in, out: filepath.Join(dir, fmt.Sprintf("out%d.csv", i)), api: api.URL, rule: testRule, margin: throttle.DefaultMargin, timeout: defaultAPITimeout, workers: 8, redisURL: srv.URL()}
		wg.Go(func() { errs[i] = run(t.Context(), cfg, io.Discard, &stderrs[i]) })
	}
	wg.Wait()

	for i := range 2 {
		require.NoError(t, errs[i], stderrs[i].String())
		requireEnriched(t, records, readCSV(t, filepath.Join(dir, fmt.Sprintf("out%d.csv", i))))
		require.Contains(t, stderrs[i].String(), "redis 127.0.0.1:")
	}
	requireUnderLimit(t, api, 80)
}

// -in - reads the records from stdin.
func TestInputFromStdin(t *testing.T) {
	t.Parallel()
	api := startTestAPI(t, 100, time.Second)
	in, records := writeInput(t, 3)
	data, err := os.ReadFile(in)
	require.NoError(t, err)
	out := filepath.Join(t.TempDir(), "out.csv")
	var stderr lockedBuffer
	err = run(t.Context(), config{in: "-", stdin: bytes.NewReader(data), out: out, api: api.URL, rule: "100/1s", margin: throttle.DefaultMargin, timeout: defaultAPITimeout, workers: 2}, io.Discard, &stderr)
	require.NoError(t, err, stderr.String())
	requireEnriched(t, records, readCSV(t, out))

	err = run(t.Context(), config{in: "-", stdin: strings.NewReader(""), api: api.URL, rule: "100/1s", margin: throttle.DefaultMargin, timeout: defaultAPITimeout, workers: 2}, io.Discard, &stderr)
	require.ErrorContains(t, err, "-in: stdin: empty, want a header line")
}

// A REDIS_URL that names one node of a Redis Cluster stops the job before
// any API call: through that node alone, the calls for every target whose
// keys live on another node would fail, and the job would run on its
// fallback share throughout.
func TestARedisClusterNodeIsRefused(t *testing.T) {
	t.Parallel()
	cluster := redistest.StartCluster(t)
	api := startTestAPI(t, testLimit, testWindow)
	in, _ := writeInput(t, 3)
	var stderr lockedBuffer
	err := run(t.Context(), config{in: in, out: filepath.Join(t.TempDir(), "out.csv"), api: api.URL, rule: testRule, margin: throttle.DefaultMargin,
		timeout: defaultAPITimeout, workers: 2, redisURL: "redis://" + cluster.Addrs[0]}, io.Discard, &stderr)
	require.ErrorContains(t, err, "REDIS_URL: redis "+cluster.Addrs[0]+" db 0 is a node of a Redis Cluster: want a single server")
	var ce *configError
	require.ErrorAs(t, err, &ce, "exit status 2")
	require.Zero(t, api.Site.Stats().Requests, "no API call")
}

// With no -api and no -out, run starts its own fake API, writes to stdout
// and reports what the fake API saw.
func TestRunDefaults(t *testing.T) {
	t.Parallel()
	in, records := writeInput(t, 5)
	var stdout bytes.Buffer
	var stderr lockedBuffer

	err := run(t.Context(), config{in: in, rule: "20/1s", margin: throttle.DefaultMargin, timeout: defaultAPITimeout, workers: 8}, &stdout, &stderr)
	require.NoError(t, err, stderr.String())

	got, err := csv.NewReader(&stdout).ReadAll()
	require.NoError(t, err)
	requireEnriched(t, records, got)
	require.Contains(t, stderr.String(), "embedded store")
	require.Contains(t, stderr.String(), "the fake API allows 20 per 1s; it saw 5 requests, at most 5 in one window, 0 answered 429")
}

func TestRunErrors(t *testing.T) {
	t.Parallel()
	api := startTestAPI(t, 100, time.Second)
	good, _ := writeInput(t, 3)
	dir := t.TempDir()
	noCode := filepath.Join(dir, "nocode.csv")
	require.NoError(t, os.WriteFile(noCode, []byte("id,name,country\nR1,Acme,DE\n"), 0o600))
	empty := filepath.Join(dir, "empty.csv")
	require.NoError(t, os.WriteFile(empty, nil, 0o600))

	link := filepath.Join(dir, "link.csv")
	require.NoError(t, os.Symlink(good, link))
	dirLink := filepath.Join(t.TempDir(), "dirlink")
	require.NoError(t, os.Symlink(dir, dirLink))

	ok := config{in: good, api: api.URL, rule: "100/1s", margin: throttle.DefaultMargin, timeout: defaultAPITimeout, workers: 2}
	tests := []struct {
		name   string
		change func(*config)
		want   string // in the error
	}{
		{"bad rule", func(c *config) { c.rule = "100/m" }, "-rule: bad rule"},
		{"no workers", func(c *config) { c.workers = 0 }, "-workers 0: want at least 1"},
		{"no margin", func(c *config) { c.margin = 0 }, "-margin 0s: want at least 20ms"},
		{"a margin below MinMargin", func(c *config) { c.margin = 15 * time.Millisecond }, "-margin 15ms: want at least 20ms"},
		{"a margin past 366 days", func(c *config) { c.margin = math.MaxInt64 }, "-margin 2562047h47m16.854775807s: want at most 366 days"},
		{"no API timeout", func(c *config) { c.timeout = 0 }, "-api-timeout 0s: want more than 0"},
		{"negative API timeout", func(c *config) { c.timeout = -time.Second }, "-api-timeout -1s: want more than 0"},
		{"missing input", func(c *config) { c.in = filepath.Join(dir, "missing.csv") }, "missing.csv: no such file"},
		{"empty input", func(c *config) { c.in = empty }, "empty, want a header line"},
		{"no code column", func(c *config) { c.in = noCode }, `no "country_code" column`},
		{"bad API URL", func(c *config) { c.api = "ftp://example.com" }, `-api "ftp://example.com": want an http:// or https:// URL`},
		{"bad API URL with a password", func(c *config) { c.api = "ftp://apiuser:APISECRET@example.com" }, `-api "ftp://apiuser:xxxxx@example.com": want an http:// or https:// URL`},
		{"API URL without a host, with a password", func(c *config) { c.api = "http://apiuser:APISECRET@" }, `-api "http://apiuser:xxxxx@": want an http:// or https:// URL`},
		{"API URL without a scheme, with a password", func(c *config) { c.api = "apiuser:APISECRET@example.com" }, `-api "apiuser:…": want an http:// or https:// URL`},
		{"bad API URL with a token", func(c *config) { c.api = "ftp://APISECRET@example.com" }, `-api "ftp://xxxxx@example.com": want an http:// or https:// URL`},
		{"API URL without a scheme, with a token", func(c *config) { c.api = "APISECRET@example.com/v1" }, `-api: no scheme: want an http:// or https:// URL`},
		{"API URL that does not parse, with a password", func(c *config) { c.api = "http://apiuser:APISECRET/1@example.com" }, `-api: not a URL: a port that is not a number`},
		{"rejects on stdout", func(c *config) { c.rejects = "-" }, "-rejects -: want a file"},
		{"output over the input", func(c *config) { c.out = good }, "-out is the -in file"},
		{"rejects over the input, by a link", func(c *config) { c.rejects = link }, "-rejects is the -in file"},
		{"rejects over the output", func(c *config) { c.out, c.rejects = filepath.Join(dir, "o.csv"), filepath.Join(dir, "o.csv") }, "-rejects is the -out file"},
		{"rejects over a new output, by a link to its directory", func(c *config) {
			c.out, c.rejects = filepath.Join(dir, "new.csv"), filepath.Join(dirLink, "new.csv")
		}, "-rejects is the -out file"},
		{"rejects over a new output, by a relative path", func(c *config) {
			wd, err := os.Getwd()
			require.NoError(t, err)
			rel, err := filepath.Rel(wd, filepath.Join(dir, "new2.csv"))
			require.NoError(t, err)
			c.out, c.rejects = filepath.Join(dir, "new2.csv"), rel
		}, "-rejects is the -out file"},
		{"rejects over a new output, by '..' after a link", func(c *config) {
			real := filepath.Join(dir, "real")
			require.NoError(t, os.MkdirAll(filepath.Join(real, "sub"), 0o700))
			require.NoError(t, os.MkdirAll(filepath.Join(dir, "a"), 0o700))
			require.NoError(t, os.Symlink(filepath.Join(real, "sub"), filepath.Join(dir, "a", "link")))
			c.out, c.rejects = filepath.Join(real, "new3.csv"), dir+"/a/link/../new3.csv" // not Join: it would drop "link/.."
		}, "-rejects is the -out file"},
		{"bad API URL with a key in its query", func(c *config) { c.api = "ftp://example.com/base?api_key=APISECRET&APISECRET" }, `-api "ftp://example.com/base?api_key=xxxxx&xxxxx": want an http:// or https:// URL`},
		{"REDIS_URL with a port but no host name", func(c *config) { c.redisURL = "redis://:hunter2@:6390/0" }, `REDIS_URL: no host: want redis://`},
		{"REDIS_URL with a db parameter below 0", func(c *config) { c.redisURL = "redis://:hunter2@127.0.0.1:6390?db=-1" }, `REDIS_URL: database -1: want 0 or more`},
		{"REDIS_URL without //", func(c *config) { c.redisURL = "redis:hunter2@127.0.0.1:6390/0" }, `REDIS_URL: no "//" after "redis:": want redis://`},
		{"REDIS_URL without a host", func(c *config) { c.redisURL = "redis://:hunter2@/0" }, `REDIS_URL: no host: want redis://`},
		{"REDIS_URL with a database below 0", func(c *config) { c.redisURL = "redis://:hunter2@127.0.0.1:6390/-1" }, `REDIS_URL: database -1: want 0 or more`},
		{"bad REDIS_URL", func(c *config) { c.redisURL = "redis://:hunter2@127.0.0.1:x/0" }, `REDIS_URL: not a URL: a port that is not a number`},
		{"a bad escape in REDIS_URL's password", func(c *config) { c.redisURL = "redis://:hun%zzter2@127.0.0.1/0" }, `REDIS_URL: not a URL: a '%' not followed by two hexadecimal digits`},
		{"REDIS_URL without a scheme", func(c *config) { c.redisURL = ":hunter2@127.0.0.1:6390" }, `REDIS_URL: not a URL: no scheme: want redis://, rediss:// or unix://`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := ok
			tc.change(&cfg)
			var stdout bytes.Buffer
			var stderr lockedBuffer
			err := run(t.Context(), cfg, &stdout, &stderr)
			require.ErrorContains(t, err, tc.want)
			var ce *configError
			require.ErrorAs(t, err, &ce, "a configuration error: exit status 2")
			require.NotContains(t, err.Error(), "hunter2", "the Redis password")
			require.NotContains(t, err.Error(), "APISECRET", "the API's password")
			require.NotContains(t, err.Error(), "%zz", "a part of the Redis password")
			require.Empty(t, stdout.String(), "output of a failed run")
		})
	}
}

// Bad records are rejected one by one, each reported with its line and
// reason and kept in full in the -rejects file; every good record is still
// enriched and written, and the run ends in an error that counts them.
// Codes that cannot be a country cost no API call.
func TestBadRecordsAreRejectedAndTheRestWritten(t *testing.T) {
	t.Parallel()
	api := startTestAPI(t, 100, time.Second)
	dir := t.TempDir()
	in := filepath.Join(dir, "in.csv")
	require.NoError(t, os.WriteFile(in, []byte(strings.Join([]string{
		"id,name,country_code",
		"R1,Acme,DE",
		"R2,Nowhere,ZZ", // unknown to the API: 404
		"R3,Blank,",
		"R4,Long,USA",
		"R5,Spaced, DE ",
		"R6,Path,../../etc",
		"R7,Short",
		`R8,Quo"te,FR`, // not CSV
		"R9,Beta,se",   // lower case is fine
		"R10,Gamma,JP",
	}, "\n")+"\n"), 0o600))
	out, rej := filepath.Join(dir, "out.csv"), filepath.Join(dir, "rejects.csv")
	var stderr lockedBuffer

	err := run(t.Context(), config{in: in, out: out, rejects: rej, api: api.URL, rule: "100/1s", margin: throttle.DefaultMargin, timeout: defaultAPITimeout, workers: 4}, io.Discard, &stderr)
	require.EqualError(t, err, "7 of 10 records rejected, each reported above", stderr.String())

	head := []string{"id", "name", "country_code"}
	require.Equal(t, [][]string{
		append(slices.Clone(head), "country_name", "region"),
		{"R1", "Acme", "DE", countries["DE"].Name, countries["DE"].Region},
		{"R9", "Beta", "se", countries["SE"].Name, countries["SE"].Region},
		{"R10", "Gamma", "JP", countries["JP"].Name, countries["JP"].Region},
	}, readCSV(t, out))
	reason := func(code string) string {
		return fmt.Sprintf("country_code %q: want two letters (ISO 3166-1 alpha-2)", code)
	}
	require.Equal(t, [][]string{
		append(slices.Clone(head), "rejected_line", "rejected_reason", "rejected_text"),
		{"R2", "Nowhere", "ZZ", "3", "GET " + api.URL + "/v1/countries/ZZ: 404 Not Found", ""},
		{"R3", "Blank", "", "4", reason(""), ""},
		{"R4", "Long", "USA", "5", reason("USA"), ""},
		{"R5", "Spaced", " DE ", "6", reason(" DE "), ""},
		{"R6", "Path", "../../etc", "7", reason("../../etc"), ""},
		{"", "", "", "8", "2 fields, want 3 as in the header", "R7,Short"},
		{"", "", "", "9", `bare " in non-quoted-field`, `R8,Quo"te,FR`},
	}, readCSV(t, rej), "every rejected record, with its line and reason: as read, or as text when its fields do not fit")
	for _, want := range []string{
		"line 3 rejected: GET " + api.URL + "/v1/countries/ZZ: 404 Not Found",
		`line 4 rejected: country_code "": want two letters`,
		`line 5 rejected: country_code "USA": want two letters`,
		`line 6 rejected: country_code " DE ": want two letters`,
		`line 7 rejected: country_code "../../etc": want two letters`,
		"line 8 rejected: 2 fields, want 3 as in the header",
		`line 9 rejected: bare " in non-quoted-field`,
		"pipeline: 10 records: 3 enriched, 7 rejected; 4 API calls, 0 answered 429",
	} {
		require.Contains(t, stderr.String(), want)
	}
	require.Equal(t, 4, api.Site.Stats().Requests, "calls: the three good codes and ZZ")
}

// A file that begins with a byte order mark (a spreadsheet's "CSV UTF-8")
// is read as the same file without it: the first column keeps its name,
// in the output too.
func TestAByteOrderMarkIsNotPartOfTheHeader(t *testing.T) {
	t.Parallel()
	api := startTestAPI(t, 100, time.Second)
	dir := t.TempDir()
	in, out := filepath.Join(dir, "in.csv"), filepath.Join(dir, "out.csv")
	for _, header := range []string{"country_code,id", "id,country_code"} {
		first, second := "DE", "R1"
		if header == "id,country_code" {
			first, second = second, first
		}
		require.NoError(t, os.WriteFile(in, []byte("\ufeff"+header+"\n"+first+","+second+"\n"), 0o600))
		var stderr lockedBuffer
		err := run(t.Context(), config{in: in, out: out, api: api.URL, rule: "100/1s", margin: throttle.DefaultMargin, timeout: defaultAPITimeout, workers: 1}, io.Discard, &stderr)
		require.NoError(t, err, stderr.String())
		got := readCSV(t, out)
		require.Equal(t, append(strings.Split(header, ","), "country_name", "region"), got[0], header)
		require.Len(t, got, 2, header)
	}
}

// A quote that is never closed would take every line after it into one
// field: only its own line is rejected, and reading goes on at the next.
func TestAnUnclosedQuoteRejectsOnlyItsLine(t *testing.T) {
	t.Parallel()
	api := startTestAPI(t, 100, time.Second)
	dir := t.TempDir()
	in := filepath.Join(dir, "in.csv")
	require.NoError(t, os.WriteFile(in, []byte("id,name,country_code\r\nA1,Alpha,DE\r\nA2,\"Open,FR\r\nA3,Gamma,US\r\nA4,\"Multi\nline\",JP\r\nA5,Eps,GB"), 0o600))
	out, rej := filepath.Join(dir, "out.csv"), filepath.Join(dir, "rejects.csv")
	var stderr lockedBuffer

	err := run(t.Context(), config{in: in, out: out, rejects: rej, api: api.URL, rule: "100/1s", margin: throttle.DefaultMargin, timeout: defaultAPITimeout, workers: 2}, io.Discard, &stderr)
	require.EqualError(t, err, "1 of 5 records rejected, each reported above", stderr.String())
	require.Equal(t, [][]string{
		{"id", "name", "country_code", "country_name", "region"},
		{"A1", "Alpha", "DE", countries["DE"].Name, countries["DE"].Region},
		{"A3", "Gamma", "US", countries["US"].Name, countries["US"].Region},
		{"A4", "Multi\nline", "JP", countries["JP"].Name, countries["JP"].Region},
		{"A5", "Eps", "GB", countries["GB"].Name, countries["GB"].Region},
	}, readCSV(t, out))
	require.Contains(t, stderr.String(), `pipeline: line 3 rejected: extraneous or missing " in quoted-field: "A2,\"Open,FR"`)
}

// A record whose quoted field spans lines and then breaks is rejected
// once, with every one of its lines, and reading goes on after the line of
// its error: the lines inside its quotes are not records.
func TestABrokenMultiLineRecordIsRejectedOnce(t *testing.T) {
	t.Parallel()
	api := startTestAPI(t, 100, time.Second)
	dir := t.TempDir()
	in := filepath.Join(dir, "in.csv")
	require.NoError(t, os.WriteFile(in, []byte("name,country_code\n\"a\nBob,FR\n\",U\"S\nC,DE\n"), 0o600))
	out := filepath.Join(dir, "out.csv")
	var stderr lockedBuffer

	err := run(t.Context(), config{in: in, out: out, api: api.URL, rule: "100/1s", margin: throttle.DefaultMargin, timeout: defaultAPITimeout, workers: 2}, io.Discard, &stderr)
	require.EqualError(t, err, "1 of 2 records rejected, each reported above", stderr.String())
	require.Equal(t, [][]string{
		{"name", "country_code", "country_name", "region"},
		{"C", "DE", countries["DE"].Name, countries["DE"].Region},
	}, readCSV(t, out))
	require.Equal(t, 1, strings.Count(stderr.String(), "rejected:"), stderr.String())
	require.Contains(t, stderr.String(), `pipeline: line 2 rejected: bare " in non-quoted-field: "\"a\nBob,FR\n\",U\"S"`)
}

// requireUnderLimit checks that api saw n requests, none answered 429,
// and never more than its limit in one window.
func requireUnderLimit(t *testing.T, api *fakeAPI, n int) {
	t.Helper()
	st := api.Site.Stats()
	var arrivals strings.Builder // for the messages
	for _, a := range st.Arrivals {
		fmt.Fprintf(&arrivals, " %v", a.Sub(st.Arrivals[0]).Round(time.Millisecond))
	}
	require.Equal(t, n, st.Requests, "requests the API saw; arrivals:%s", &arrivals)
	require.Equal(t, 0, st.TooMany, "requests answered 429; arrivals:%s", &arrivals)
	require.LessOrEqual(t, st.Peak, testLimit, "requests in the busiest window; arrivals:%s", &arrivals)
}

// startTestAPI starts the fake API with the given limit until the test ends.
func startTestAPI(t *testing.T, limit int, window time.Duration) *fakeAPI {
	t.Helper()
	api, err := startAPI(limit, window)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, api.Close()) })
	return api
}

// writeInput writes n records, with the header, to a CSV file in a
// temporary directory and returns its path and the records. The codes go
// round every country the fake API knows; one name needs CSV quoting.
func writeInput(t *testing.T, n int) (string, [][]string) {
	t.Helper()
	codes := slices.Sorted(maps.Keys(countries))
	records := [][]string{{"id", "name", "country_code"}}
	for i := range n {
		records = append(records, []string{fmt.Sprintf("R%03d", i+1), fmt.Sprintf("Org %03d", i+1), codes[i%len(codes)]})
	}
	records[1][1] = `Lumen "Bright" Works, Ltd.`
	path := filepath.Join(t.TempDir(), "in.csv")
	f, err := os.Create(path)
	require.NoError(t, err)
	require.NoError(t, csv.NewWriter(f).WriteAll(records))
	require.NoError(t, f.Close())
	return path, records
}

// readCSV returns every line of the CSV file at path.
func readCSV(t *testing.T, path string) [][]string {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	got, err := csv.NewReader(f).ReadAll()
	require.NoError(t, err)
	return got
}

// requireEnriched checks that got is the input, header included, with the
// country's name and region appended to every line, in input order: every
// record exactly once.
func requireEnriched(t *testing.T, input, got [][]string) {
	t.Helper()
	want := [][]string{append(slices.Clone(input[0]), "country_name", "region")}
	for _, rec := range input[1:] {
		c := countries[rec[2]]
		require.NotEmpty(t, c.Name, "country %q", rec[2])
		want = append(want, append(slices.Clone(rec), c.Name, c.Region))
	}
	require.Equal(t, want, got)
}

// lockedBuffer is a bytes.Buffer that loggers on several goroutines may
// write to.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Clone(b.buf.String())
}
