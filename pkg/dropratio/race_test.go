//go:build race

package dropratio

const raceEnabled = true
