package deploy

import (
	"strconv"
	"strings"

	"github.com/omnipd/omnipd/kvconnector"
	"github.com/omnipd/omnipd/topology"
)

// moriioReadModes refuses a MoRIIO prefill and decode that disagree on
// kv_connector_extra_config.read_mode. Each engine picks its mode from its
// own config, and the two modes move KV in opposite directions: a READ
// decode pulls blocks the prefill must keep for it, a WRITE decode waits
// for a prefill to push into its blocks. A pair that disagrees never
// exchanges KV (vLLM's MoRIIO proxy refuses to route such a pair: the
// instances' registered transfer_mode must all be equal). The error is at
// the decode's read_mode when the config wrote one, else at the
// prefill's.
func (p *problems) moriioReadModes(doc *Document) {
	prefill, decode := -1, -1
	for i, s := range doc.Stages {
		if s.KV == nil || s.KV.Connector != kvconnector.MoRIIOConnector {
			continue
		}
		switch s.Role {
		case topology.RolePrefill:
			prefill = i
		case topology.RoleDecode:
			decode = i
		}
	}
	if prefill < 0 || decode < 0 {
		return
	}
	pn := doc.Stages[prefill].KV.ExtraConfig.Get("read_mode")
	dn := doc.Stages[decode].KV.ExtraConfig.Get("read_mode")
	if moriioRead(pn) == moriioRead(dn) {
		return
	}
	at, here, other, otherName := decode, dn, pn, "prefill"
	if dn == nil || dn.Pos == (Pos{}) {
		at, here, other, otherName = prefill, pn, dn, "decode"
	}
	_, path := fieldAt(doc.Stages[at], "kv_transfer_config.kv_connector_extra_config.read_mode")
	p.errorf(here, writtenPath(here, path),
		"read_mode %s (%s) differs from the %s's %s (%s); MoRIIO's prefill and decode must use the same mode, so set read_mode alike on both",
		describeReadMode(here), moriioModeName(here), otherName, describeReadMode(other), moriioModeName(other))
}

// moriioRead is whether a read_mode value selects READ, as vLLM's MoRIIO
// reads it (moriio_common.py get_moriio_mode): the value's Python string,
// lowered and stripped, is "true" or "1". Unset means WRITE.
func moriioRead(n *Node) bool {
	if n == nil || n.Kind != KindScalar {
		return false
	}
	v := strings.ToLower(strings.TrimSpace(n.Value))
	switch n.Tag {
	case "!!bool":
		b, err := strconv.ParseBool(v)
		return err == nil && b
	case "!!int":
		i, err := strconv.ParseInt(v, 0, 64)
		return err == nil && i == 1
	}
	return v == "true" || v == "1"
}

func moriioModeName(n *Node) string {
	if moriioRead(n) {
		return "READ"
	}
	return "WRITE"
}

func describeReadMode(n *Node) string {
	switch {
	case n == nil:
		return "unset"
	case n.Kind != KindScalar:
		return "a " + n.Kind.String()
	case n.Tag == "!!str":
		return strconv.Quote(n.Value)
	}
	return n.Value
}
