package redistest

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// sentinelDownAfter is how long a started Sentinel waits before it takes an
// unanswering master for down (and, with quorum 1, fails it over).
const sentinelDownAfter = time.Second

// StartSentinel starts a Redis Sentinel (redis-server --sentinel) on a free
// loopback port that monitors master under name, with a quorum of one and a
// master taken for down after a second without answers. It waits, for at
// most 10 seconds, until the Sentinel reports the master as ok. The
// returned Server is the Sentinel: Kill and Restart apply to it.
//
// A Cleanup registered on tb kills the Sentinel when the test ends, also
// when it fails. StartSentinel fails tb if redis-server is not on PATH.
func StartSentinel(tb testing.TB, master *Server, name string) *Server {
	tb.Helper()
	s := &Server{bin: lookBinary(tb, "redis-server"), dir: tb.TempDir()}
	s.conf = fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 1\nsentinel down-after-milliseconds %s %d\n",
		name, master.port, name, sentinelDownAfter.Milliseconds())
	launchNew(tb, s, false, nil)
	deadline := time.Now().Add(startTimeout)
	for {
		info, err := command(s.Addr, time.Second, "INFO", "sentinel")
		if err == nil {
			if m, _ := infoField(info, "master0"); strings.Contains(m, "name="+name+",status=ok") {
				return s
			}
			err = fmt.Errorf("INFO sentinel: %s", strings.TrimSpace(info))
		}
		if time.Now().After(deadline) {
			tb.Fatalf("redistest: sentinel %s does not see master %s at %s as ok within %v: %v", s.Addr, name, master.Addr, startTimeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
