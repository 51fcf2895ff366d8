//go:build !race

package dropratio

const raceEnabled = false
