package redistest

import (
	"crypto/rand"
	"encoding/hex"
	"os/exec"
	"testing"
)

// lookBinary returns the path of the named program on PATH, or fails tb
// with a message that names the program and how to install it.
func lookBinary(tb testing.TB, name string) string {
	tb.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		tb.Fatalf("%s not found in PATH: install it (apt-get install redis-server) or run scripts/install-redis.sh", name)
	}
	return path
}

// KeyPrefix returns a random key prefix of the form "fgtest:<16 hex digits>:"
// that is unique to the calling test, so that tests sharing a server never
// see each other's keys and never need FLUSHDB. The prefix holds no {hash
// tag}: keys built from it spread over all cluster slots unless the caller
// adds a tag.
func KeyPrefix(tb testing.TB) string {
	tb.Helper()
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never returns an error.
	return "fgtest:" + hex.EncodeToString(b[:]) + ":"
}
