package redistest

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// clusterNodes is the number of masters StartCluster starts.
	clusterNodes = 3
	// clusterSlots is the number of hash slots in a Redis Cluster.
	clusterSlots = 16384
	// clusterTimeout bounds `redis-cli --cluster create` and, separately,
	// the wait for every node to report the cluster as ok.
	clusterTimeout = 30 * time.Second
)

// Cluster is a Redis Cluster of three masters, without replicas, started by
// StartCluster. Each master is a redis-server process in its own temporary
// directory, with persistence disabled.
type Cluster struct {
	// Addrs are the masters' addresses, "127.0.0.1:PORT", in the order
	// redis-cli received them: the first owns slots 0-5460, the second
	// 5461-10922 and the third 10923-16383.
	Addrs []string
}

// StartCluster starts three redis-server processes in cluster mode, joins
// them with `redis-cli --cluster create ... --cluster-replicas 0`, and waits
// until every node reports cluster_state:ok, knows all three nodes and sees
// all 16384 slots assigned. Each wait is bounded (30 seconds); on failure it
// fails tb with the redis-cli output and each node's last CLUSTER INFO.
//
// Each node's port and cluster bus port (port+10000) are free loopback
// ports. A Cleanup registered on tb kills every node when the test ends,
// also when it fails. StartCluster fails tb if redis-server or redis-cli is
// not on PATH.
func StartCluster(tb testing.TB) *Cluster {
	tb.Helper()
	lookBinary(tb, "redis-server") // fail before starting anything
	cli := lookBinary(tb, "redis-cli")

	c := &Cluster{}
	for range clusterNodes {
		c.Addrs = append(c.Addrs, startServer(tb, true, nil).Addr)
	}

	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	args := slices.Concat([]string{"--cluster", "create"}, c.Addrs,
		[]string{"--cluster-replicas", "0", "--cluster-yes"})
	cmd := exec.CommandContext(ctx, cli, args...)
	cmd.SysProcAttr = sysProcAttr()
	cmd.WaitDelay = time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		tb.Fatalf("redistest: %s %s: %v\n--- redis-cli output ---\n%s",
			cli, strings.Join(args, " "), err, out)
	}

	if infos, ok := c.waitOK(); !ok {
		tb.Fatalf("redistest: cluster %s not ok within %v\n%s--- redis-cli output ---\n%s",
			strings.Join(c.Addrs, " "), clusterTimeout, infos, out)
	}
	return c
}

// waitOK polls CLUSTER INFO on every node until all of them report a
// healthy three-master cluster, or clusterTimeout passes. When the wait
// fails it returns each node's last reply, or error, for the message.
func (c *Cluster) waitOK() (lastInfos string, ok bool) {
	want := map[string]string{
		"cluster_state":          "ok",
		"cluster_slots_assigned": fmt.Sprint(clusterSlots),
		"cluster_known_nodes":    fmt.Sprint(clusterNodes),
	}
	deadline := time.Now().Add(clusterTimeout)
	for {
		var b strings.Builder
		ok := true
		for _, addr := range c.Addrs {
			info, err := command(addr, time.Second, "CLUSTER", "INFO")
			if err != nil {
				ok = false
				fmt.Fprintf(&b, "--- %s: CLUSTER INFO: %v\n", addr, err)
				continue
			}
			fmt.Fprintf(&b, "--- %s: CLUSTER INFO ---\n%s\n", addr, strings.TrimSpace(info))
			for field, v := range want {
				if got, _ := infoField(info, field); got != v {
					ok = false
				}
			}
		}
		if ok {
			return "", true
		}
		if time.Now().After(deadline) {
			return b.String(), false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Client returns a go-redis cluster client seeded with all three masters,
// with default options but for ContextTimeoutEnabled (which
// throttle.NewRedisStore requires). A Cleanup registered on tb closes it.
func (c *Cluster) Client(tb testing.TB) *redis.ClusterClient {
	tb.Helper()
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: slices.Clone(c.Addrs), ContextTimeoutEnabled: true})
	tb.Cleanup(func() { closeClient(tb, rdb) })
	return rdb
}

// URL returns the cluster's addresses as a URL that redis.ParseClusterURL
// accepts: the first master as host and the others as addr parameters,
// "redis://127.0.0.1:P1?addr=127.0.0.1:P2&addr=127.0.0.1:P3".
func (c *Cluster) URL() string {
	var b strings.Builder
	b.WriteString("redis://")
	b.WriteString(c.Addrs[0])
	for i, addr := range c.Addrs[1:] {
		if i == 0 {
			b.WriteByte('?')
		} else {
			b.WriteByte('&')
		}
		b.WriteString("addr=")
		b.WriteString(addr)
	}
	return b.String()
}
