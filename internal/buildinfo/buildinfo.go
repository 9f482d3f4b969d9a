// Package buildinfo says which omnipd a binary is: the version stamped at
// build time, or else what the Go toolchain recorded in the binary (the
// main module's version, the VCS revision and its time).
package buildinfo

import (
	"fmt"
	"regexp"
	"runtime/debug"
	"strings"
)

// stamped is set at build time:
//
//	go build -ldflags "-X github.com/omnipd/omnipd/internal/buildinfo.stamped=v1.2.3" ./cmd/omnipd
var stamped string

// Info is what a binary knows of its build.
type Info struct {
	// Version is the stamped version, else the main module's version as
	// the toolchain recorded it (a tag, or a pseudo-version from the VCS),
	// else "dev".
	Version string
	// Revision and Time are the VCS revision and commit time, when the
	// toolchain recorded them (not with -buildvcs=false); Modified says the
	// work tree had changes.
	Revision, Time string
	Modified       bool
	// GoVersion is the toolchain that built the binary.
	GoVersion string
}

// Read returns this binary's build information.
func Read() Info {
	return fromBuildInfo(stamped, readBuildInfo())
}

func readBuildInfo() *debug.BuildInfo {
	bi, _ := debug.ReadBuildInfo()
	return bi
}

// fromBuildInfo is Read's logic, apart from the process, for tests.
func fromBuildInfo(stamp string, bi *debug.BuildInfo) Info {
	info := Info{Version: stamp}
	if bi != nil {
		info.GoVersion = bi.GoVersion
		if info.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			info.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				info.Revision = s.Value
			case "vcs.time":
				info.Time = s.Value
			case "vcs.modified":
				info.Modified = s.Value == "true"
			}
		}
	}
	if info.Version == "" {
		info.Version = "dev"
	}
	return info
}

// Version is this binary's version (Info.Version).
func Version() string { return Read().Version }

// pseudoVersion matches the versions the go command makes up for a commit
// that no tag names (https://go.dev/ref/mod#pseudo-versions): vX.0.0-,
// vX.Y.Z-pre.0. or vX.Y.Z-0. followed by the commit's UTC time and the
// first twelve hex digits of its hash.
var pseudoVersion = regexp.MustCompile(`^v\d+\.\d+\.\d+-(.+\.)?\d{14}-[0-9a-f]{12}$`)

// Release reports whether Version names a release, which an image or a
// package of that version can carry: a stamped version or a tag. A
// development build ("dev"), a pseudo-version (a build of an untagged
// commit) and a version with build metadata ("+dirty" for a modified tree,
// "+incompatible") are not.
func (i Info) Release() bool {
	v := i.Version
	return v != "" && v != "dev" && !strings.Contains(v, "+") && !pseudoVersion.MatchString(v)
}

// String is the one line "omnipd version" prints: the version, then what
// is known of the revision, then the toolchain, e.g.
//
//	omnipd v0.4.0 (revision 3b2af53c1e0f, 2026-12-01T10:00:00Z, modified; go1.26.8)
func (i Info) String() string {
	var details []string
	if i.Revision != "" {
		rev := i.Revision
		if len(rev) > 12 {
			rev = rev[:12]
		}
		details = append(details, "revision "+rev)
	}
	if i.Time != "" {
		details = append(details, i.Time)
	}
	if i.Modified {
		details = append(details, "modified")
	}
	line := "omnipd " + i.Version
	switch {
	case len(details) > 0 && i.GoVersion != "":
		return fmt.Sprintf("%s (%s; %s)", line, strings.Join(details, ", "), i.GoVersion)
	case len(details) > 0:
		return fmt.Sprintf("%s (%s)", line, strings.Join(details, ", "))
	case i.GoVersion != "":
		return fmt.Sprintf("%s (%s)", line, i.GoVersion)
	}
	return line
}
