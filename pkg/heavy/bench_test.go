package heavy

import (
	"testing"
)

// BenchmarkAdd measures Add over pre-generated values: a million distinct
// ones (every Add misses the caches, as a sketch holding 1M tenants
// would), and ten (all in cache), light (under the threshold) or heavy
// (members of the heavy set, which costs a probe of its table).
func BenchmarkAdd(b *testing.B) {
	million := names(1_000_000)
	ten := names(10)
	for _, c := range []struct {
		name string
		vals []string
		o    Options
	}{
		{"distinct-1M", million, Options{}},
		{"distinct-1M-wide", million, Options{Counters: 1 << 20}},
		{"distinct-10", ten, Options{}},
		{"distinct-10-heavy", ten, Options{Threshold: 1}},
	} {
		s := mustNew(b, c.o)
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				s.Add(c.vals[i])
				if i++; i == len(c.vals) {
					i = 0
				}
			}
		})
		b.Run(c.name+"-parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					s.Add(c.vals[i])
					if i++; i == len(c.vals) {
						i = 0
					}
				}
			})
		})
	}
}
