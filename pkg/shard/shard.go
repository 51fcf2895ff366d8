// Package shard says which controller shard computes a callee's buckets.
//
// Controllers are partitioned by callee: every bucket of a callee (its
// callers, procedures, tiers and descriptor values) lives on one shard, so
// the law's capacity split, which needs all of a callee's callers at once,
// never spans two processes. The owner of a callee is a pure function of its
// name and the shard count (jump consistent hashing), so every aggregator,
// sidecar and controller computes the same owner without asking anyone, and
// growing the count from n to n+1 moves only a 1/(n+1) share of the callees,
// all of them to the new shard.
//
// Standard library only: the sidecar library and the control plane import
// it alike.
package shard

import (
	"fmt"
	"strings"
)

// Placeholder is replaced by a shard's index in an address template:
// "sluice-controller-{shard}.sluice-controller:18000" names the pods of a
// StatefulSet, whose ordinals are the shards.
const Placeholder = "{shard}"

// MaxCount bounds the shard count. Far above any fleet's need (a shard holds
// a million leaves within its tick budget); it keeps a hostile count, read
// from a policy or an answer, from making a client open that many streams.
const MaxCount = 256

// Map is one shard's place: its index among Count shards. The zero Map is
// invalid; Single is the unsharded controller.
type Map struct {
	Index, Count int
}

// Single is the map of an unsharded controller: it owns every callee.
var Single = Map{Index: 0, Count: 1}

// Validate reports what is wrong with m, naming the flag a user sets.
func (m Map) Validate() error {
	if m.Count < 1 || m.Count > MaxCount {
		return fmt.Errorf("shards: %d is not in [1, %d]", m.Count, MaxCount)
	}
	if m.Index < 0 || m.Index >= m.Count {
		return fmt.Errorf("shard: %d is not in [0, %d) (the shard count)", m.Index, m.Count)
	}
	return nil
}

// Sharded reports whether there is more than one shard.
func (m Map) Sharded() bool { return m.Count > 1 }

// Owns reports whether the shard computes callee's buckets.
func (m Map) Owns(callee string) bool { return m.Count <= 1 || Owner(callee, m.Count) == m.Index }

func (m Map) String() string { return fmt.Sprintf("%d/%d", m.Index, m.Count) }

// Owner is the shard, in [0, count), that computes callee's buckets. A count
// below 2 has one shard, 0.
func Owner(callee string, count int) int {
	if count <= 1 {
		return 0
	}
	return jump(mix(fnv64a(callee)), count)
}

// Addrs expands the address templates for shard index: every "{shard}" is
// replaced by the index. Templates without the placeholder are returned as
// they are (every shard at the same addresses: a single controller, or a
// proxy that routes by resource).
func Addrs(templates []string, index int) []string {
	out := make([]string, len(templates))
	for i, t := range templates {
		out[i] = strings.ReplaceAll(t, Placeholder, fmt.Sprint(index))
	}
	return out
}

// Templated reports whether some template names a shard.
func Templated(templates []string) bool {
	for _, t := range templates {
		if strings.Contains(t, Placeholder) {
			return true
		}
	}
	return false
}

// fnv64a is FNV-1a, 64 bits: stable across releases and processes, unlike
// hash/maphash, which the owner of a callee must be.
func fnv64a(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// mix is SplitMix64's finaliser: FNV's high bits change little between names
// that differ in their last byte ("svc-1", "svc-2"), and jump reads the high
// bits first.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// jump is Lamping and Veach's jump consistent hash ("A Fast, Minimal Memory,
// Consistent Hash Algorithm", 2014): key → bucket in [0, n), moving a key
// only to the new bucket when n grows.
func jump(key uint64, n int) int {
	var b, j int64 = -1, 0
	for j < int64(n) {
		b = j
		key = key*2862933555777941757 + 1
		j = int64(float64(b+1) * (float64(int64(1)<<31) / float64((key>>33)+1)))
	}
	return int(b)
}
