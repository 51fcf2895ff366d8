package configurator

import (
	"math"
	"strconv"
	"strings"
)

// RoundUp rounds a limit up to two significant figures: 1234 → 1300,
// 87.2 → 88, 0.123 → 0.13, 100 → 100. It never rounds down, so a limit is
// never below what it was computed from, and it changes the value by less
// than 10 %: enough to give limits numbers people can read, compare and
// type, not enough to matter for protection. Values within a relative 1e-9
// of a two-figure number are taken as that number, so that 1.1 (stored as
// 1.1000000000000000888) stays 1.1 and does not become 1.2. 0, negative,
// NaN and infinite values come back unchanged.
func RoundUp(v float64) float64 {
	if !(v > 0) || math.IsInf(v, 1) {
		return v
	}
	exp := math.Floor(math.Log10(v)) - 1 // the unit of the second figure
	if exp >= 0 {
		step := math.Pow(10, exp)
		q := v / step
		n := math.Round(q)
		if math.Abs(q-n) > 1e-9*q && n < q {
			n++
		}
		return n * step
	}
	// Below 10, divide by the inverse: 10^-k is not exact in binary, 10^k is.
	inv := math.Pow(10, -exp)
	q := v * inv
	n := math.Round(q)
	if math.Abs(q-n) > 1e-9*q && n < q {
		n++
	}
	return n / inv
}

// formatRate renders a rate in rps for people: integers with thousands
// separators from 100 up ("12,345"), one decimal from 10 ("87.2"), two
// below ("0.35"), trailing zeros dropped ("88", "5").
func formatRate(v float64) string {
	switch {
	case math.IsNaN(v):
		return "-"
	case math.IsInf(v, 1):
		return "∞"
	}
	var s string
	switch a := math.Abs(v); {
	case a >= 100:
		s = strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 10:
		s = strconv.FormatFloat(v, 'f', 1, 64)
	default:
		s = strconv.FormatFloat(v, 'f', 2, 64)
	}
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return groupThousands(s)
}

// groupThousands puts commas into the integer part of a decimal number.
func groupThousands(s string) string {
	sign := ""
	if strings.HasPrefix(s, "-") {
		sign, s = "-", s[1:]
	}
	intPart, frac, hasFrac := strings.Cut(s, ".")
	if len(intPart) <= 3 {
		return sign + s
	}
	var b strings.Builder
	b.WriteString(sign)
	lead := len(intPart) % 3
	if lead > 0 {
		b.WriteString(intPart[:lead])
	}
	for i := lead; i < len(intPart); i += 3 {
		if b.Len() > len(sign) {
			b.WriteByte(',')
		}
		b.WriteString(intPart[i : i+3])
	}
	if hasFrac {
		b.WriteString("." + frac)
	}
	return b.String()
}

// formatDelta renders a relative change as a signed percentage: "+25%",
// "-4.5%", "0%". Below 10 % it keeps one decimal.
func formatDelta(from, to float64) string {
	if from == 0 {
		if to == 0 {
			return "0%"
		}
		return "+∞"
	}
	pct := (to - from) / from * 100
	var s string
	if math.Abs(pct) >= 10 {
		s = strconv.FormatFloat(pct, 'f', 0, 64)
	} else {
		s = strconv.FormatFloat(pct, 'f', 1, 64)
		s = strings.TrimSuffix(s, ".0")
	}
	if s == "0" || s == "-0" {
		return "0%"
	}
	if pct > 0 {
		s = "+" + s
	}
	return s + "%"
}

// roundRate rounds a measured rate for JSON and YAML to what formatRate
// shows: whole rps from 100 up, one decimal from 10, two below. Scripts
// then see the numbers people see, not 1054.3729166666667.
func roundRate(v float64) float64 {
	switch a := math.Abs(v); {
	case math.IsNaN(v) || math.IsInf(v, 0):
		return v
	case a >= 100:
		return math.Round(v)
	case a >= 10:
		return math.Round(v*10) / 10
	}
	return math.Round(v*100) / 100
}

// roundPct rounds a percentage to 0.1: -57.99999999999999 is -58.
func roundPct(v float64) float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return v
	}
	return math.Round(v*10) / 10
}

// roundShare rounds a share in [0, 1] to what formatShare shows: 0.1 % from
// 10 % up, 0.01 % from 0.1 %, two significant figures below, so that a
// rare drop is not rounded away.
func roundShare(s float64) float64 {
	switch {
	case s == 0 || math.IsNaN(s) || math.IsInf(s, 0):
		return s
	case s >= 0.1:
		return math.Round(s*1000) / 1000
	case s >= 0.001:
		return math.Round(s*10000) / 10000
	}
	f, _ := strconv.ParseFloat(strconv.FormatFloat(s, 'g', 2, 64), 64)
	return f
}
