package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestASignalledRunStopsAndReports sends SIGTERM, as a supervisor stops a
// job, or SIGINT, as Ctrl-C does, to a running pipeline: it stops
// promptly, reports the interruption naming the signal, exits 1 and
// leaves the earlier output as it was.
func TestASignalledRunStopsAndReports(t *testing.T) {
	t.Parallel()
	goTool, err := exec.LookPath("go")
	require.NoError(t, err, "the go command is needed to build the pipeline")
	bin := filepath.Join(t.TempDir(), "pipeline")
	out, err := exec.Command(goTool, "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "go build: %s", out)

	for _, tc := range []struct {
		sig  syscall.Signal
		name string // as the message names it
	}{
		{syscall.SIGTERM, "SIGTERM"},
		{syscall.SIGINT, "SIGINT"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			in, _ := writeInput(t, 200)
			outFile := filepath.Join(t.TempDir(), "out.csv")
			require.NoError(t, os.WriteFile(outFile, []byte("an earlier run's output\n"), 0o600))
			cmd := exec.Command(bin, "-in", in, "-out", outFile, "-rule", "5/1s") // the fake API: 40 s of quota
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			require.NoError(t, cmd.Start())
			t.Cleanup(func() {
				if cmd.ProcessState == nil {
					_ = cmd.Process.Kill()
					_ = cmd.Wait()
				}
			})
			time.Sleep(1500 * time.Millisecond) // a few calls made, many waiting
			require.NoError(t, cmd.Process.Signal(tc.sig))
			start := time.Now()
			err := cmd.Wait()
			require.Less(t, time.Since(start), 5*time.Second, "it stops promptly")
			var exit *exec.ExitError
			require.ErrorAs(t, err, &exit, "stderr: %s", stderr.String())
			require.Equal(t, 1, exit.ExitCode(), "stderr: %s", stderr.String())
			require.Regexp(t, `^pipeline: interrupted by `+regexp.QuoteMeta(tc.name)+` after \d+ of 200 records, nothing written \(an earlier -out or -rejects is left as it was\)\n$`,
				stderr.String(), "the interruption is reported, in one line")
			requireOnlyEarlierOutput(t, filepath.Dir(outFile), outFile)
		})
	}
}
