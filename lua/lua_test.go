package lua

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleetgate/fleetgate/internal/redistest"
)

// TestKeysOnlyThroughKEYS: every command the script sends names its key
// through one of the four KEYS variables, never a name built from ARGV, so
// Redis Cluster can route it and the keys share the target's hash slot.
func TestKeysOnlyThroughKEYS(t *testing.T) {
	require.Contains(t, SlidingLog, "local log, metakey, procs = KEYS[1], KEYS[2], KEYS[3]")
	require.Contains(t, SlidingLog, "local epochkey = KEYS[#KEYS]")
	calls := regexp.MustCompile(`\bp?call\('([A-Z]+)'(?:,\s*([^,)]+))?`).FindAllStringSubmatch(SlidingLog, -1)
	require.NotEmpty(t, calls)
	keys := []string{"log", "metakey", "procs", "epochkey"}
	for _, c := range calls {
		switch {
		case c[1] == "TIME":
		case c[1] == "MGET" && strings.TrimSpace(c[2]) == "unpack(mkeys":
			require.Contains(t, SlidingLog, "mkeys[#mkeys + 1] = KEYS[b]", "MGET must read keys from KEYS")
		default:
			require.Contains(t, keys, strings.TrimSpace(c[2]), "%s must take its key from KEYS", c[0])
		}
	}
	require.NotContains(t, SlidingLog, "replicate_commands", "effects replication is the default since Redis 5; the call is deprecated")
}

// TestLoads: the embedded text is a script Redis accepts, under the SHA1
// that EVALSHA will use.
func TestLoads(t *testing.T) {
	client := redistest.StartServer(t).Client(t)
	sha, err := client.ScriptLoad(context.Background(), SlidingLog).Result()
	require.NoError(t, err)
	sum := sha1.Sum([]byte(SlidingLog))
	require.Equal(t, hex.EncodeToString(sum[:]), sha)
}
