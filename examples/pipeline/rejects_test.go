package main

import (
	"encoding/csv"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetgate/fleetgate/throttle"
)

// A line that is not CSV, however long, is kept in full in the -rejects
// file, with its line and reason; stderr quotes it cut at 200 bytes.
func TestALongLineThatIsNotCSVIsKeptInFull(t *testing.T) {
	t.Parallel()
	api := startTestAPI(t, 100, time.Second)
	dir := t.TempDir()
	in := filepath.Join(dir, "in.csv")
	long := `R2,"` + strings.Repeat("Long name ", 40) + `"oops,FR`
	require.NoError(t, os.WriteFile(in, []byte("id,name,country_code\nR1,Acme,DE\n"+long+"\r\nR3,Beta,JP\n"), 0o600))
	out, rej := filepath.Join(dir, "out.csv"), filepath.Join(dir, "rejects.csv")
	var stderr lockedBuffer

	err := run(t.Context(), config{in: in, out: out, rejects: rej, api: api.URL, rule: "100/1s", margin: throttle.DefaultMargin, timeout: defaultAPITimeout, workers: 2}, io.Discard, &stderr)
	require.EqualError(t, err, "1 of 3 records rejected, each reported above", stderr.String())

	require.Equal(t, [][]string{
		{"id", "name", "country_code", "rejected_line", "rejected_reason", "rejected_text"},
		{"", "", "", "3", `extraneous or missing " in quoted-field`, long},
	}, readCSV(t, rej))
	require.Contains(t, stderr.String(), `pipeline: line 3 rejected: extraneous or missing " in quoted-field: `+strconv.Quote(long[:200]+"…"))
	require.NotContains(t, stderr.String(), long[:201], "stderr quotes 200 bytes")
	require.Len(t, readCSV(t, out), 3, "the header and the two good records")
}

// A -rejects file, fixed, is an input: its three columns are dropped, the
// fixed records are enriched, and a line whose text was never put into
// the columns is rejected again with that text.
func TestAFixedRejectsFileRunsAgain(t *testing.T) {
	t.Parallel()
	api := startTestAPI(t, 100, time.Second)
	dir := t.TempDir()
	in := filepath.Join(dir, "in.csv")
	require.NoError(t, os.WriteFile(in, []byte("id,name,country_code\nR1,Acme,DE\nR2,Long,USA\nR3,Quo\"te,FR\n"), 0o600))
	rej := filepath.Join(dir, "rejects.csv")
	cfg := config{in: in, out: filepath.Join(dir, "out.csv"), rejects: rej, api: api.URL, rule: "100/1s", margin: throttle.DefaultMargin, timeout: defaultAPITimeout, workers: 2}
	require.Error(t, run(t.Context(), cfg, io.Discard, io.Discard))

	// Fix R2's code; leave the line that is not CSV as it is.
	rows := readCSV(t, rej)
	require.Equal(t, []string{"R2", "Long", "USA", "3", `country_code "USA": want two letters (ISO 3166-1 alpha-2)`, ""}, rows[1])
	rows[1][2] = "US"
	f, err := os.Create(filepath.Join(dir, "fixed.csv"))
	require.NoError(t, err)
	require.NoError(t, csv.NewWriter(f).WriteAll(rows))
	require.NoError(t, f.Close())

	cfg.in, cfg.out, cfg.rejects = f.Name(), filepath.Join(dir, "out2.csv"), filepath.Join(dir, "rejects2.csv")
	var stderr lockedBuffer
	err = run(t.Context(), cfg, io.Discard, &stderr)
	require.EqualError(t, err, "1 of 2 records rejected, each reported above", stderr.String())
	require.Equal(t, [][]string{
		{"id", "name", "country_code", "country_name", "region"},
		{"R2", "Long", "US", countries["US"].Name, countries["US"].Region},
	}, readCSV(t, cfg.out))
	require.Equal(t, [][]string{
		{"id", "name", "country_code", "rejected_line", "rejected_reason", "rejected_text"},
		{"", "", "", "3", "rejected_text is not empty: put its fields in the columns, then empty it", `R3,Quo"te,FR`},
	}, readCSV(t, cfg.rejects))
}

// A reason quotes the field it is about cut at 200 bytes, however long
// the field: the record keeps it whole in its column of the -rejects
// file, and stderr's line is the reason's length.
func TestAReasonQuotesALongCodeCut(t *testing.T) {
	t.Parallel()
	api := startTestAPI(t, 100, time.Second)
	long := strings.Repeat("X", 2<<20)
	dir := t.TempDir()
	in := filepath.Join(dir, "in.csv")
	require.NoError(t, os.WriteFile(in, []byte("id,country_code\nR1,DE\nR2,"+long+"\n"), 0o600))
	rej := filepath.Join(dir, "rejects.csv")
	var stderr lockedBuffer

	err := run(t.Context(), config{in: in, out: filepath.Join(dir, "out.csv"), rejects: rej, api: api.URL, rule: "100/1s", margin: throttle.DefaultMargin, timeout: defaultAPITimeout, workers: 2}, io.Discard, &stderr)
	require.EqualError(t, err, "1 of 2 records rejected, each reported above", stderr.String())
	reason := `country_code "` + strings.Repeat("X", 200) + `…": want two letters (ISO 3166-1 alpha-2)`
	require.Equal(t, []string{"R2", long, "3", reason, ""}, readCSV(t, rej)[1])
	require.Contains(t, stderr.String(), "pipeline: line 3 rejected: "+reason+"\n")
	require.Less(t, len(stderr.String()), 2000, "no line quotes the whole code")
}
