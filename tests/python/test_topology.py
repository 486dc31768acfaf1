"""Topologies from Python: list, load, override by dotted path, validate; errors name the JSON path."""
import json

import pytest

import cubesim as cs


def test_list_has_the_shipped_topologies():
    names = cs.list_topologies()
    for n in ("single_cube", "ring4", "mesh4x4", "torus8x8", "h200x4", "dgx_h100x8"):
        assert n in names
    assert names == sorted(names)
    assert cs.DEFAULT_TOPOLOGY in names


def test_load_exposes_figures():
    t = cs.load_topology("ring4")
    assert t.name == "ring4"
    assert t.num_cubes == 4 and len(t.cubes) == 4
    assert t.network == "ring"
    assert [c["id"] for c in t.cubes] == [0, 1, 2, 3]
    c = t.cubes[0]
    assert c["pes"] > 0 and c["hbm"]["bandwidth_GBps"] > 0 and c["hbm"]["channels"] >= 1
    assert set(c["pe"]) >= {"clock_GHz", "tcm", "dma", "mac", "vector", "tile"}
    assert "bf16" in c["pe"]["mac"]["per_cycle"]
    names = {l["name"] for l in t.links}
    assert "c0->c1" in names and "c1->c0" in names
    assert all(isinstance(l["from"], (int, str)) for l in t.links)
    assert t.doc["name"] == "ring4"
    assert "ring4" in repr(t)
    json.dumps({"cubes": t.cubes, "links": t.links, "host": t.host, "doc": t.doc})  # plain values


def test_counts_without_per_cube_dicts_agree_with_the_lists():
    # num_links and pe_counts serve summaries of 65536 cubes without a dict per cube or link.
    for name in cs.list_topologies():
        t = cs.load_topology(name)
        assert t.num_links == len(t.links), name
        assert t.pe_counts == sorted({c["pes"] for c in t.cubes}), name
    mixed = cs.load_topology("ring4", overrides=[("cubes.2.pes", 1)])
    assert len(mixed.pe_counts) == 2 and mixed.pe_counts[0] == 1


def test_gemm_pipeline_section_is_exposed():
    assert cs.load_topology("single_cube").cubes[0]["pe"]["gemm"] is None
    g = cs.load_topology("h200x4").cubes[0]["pe"]["gemm"]
    assert g["tile"] == {"m": 128, "n": 256, "k": 64}
    assert g["tiles"]["f32"] == {"m": 128, "n": 128, "k": 32}
    assert g["tiles"]["bf16"] == g["tile"]
    assert (g["stages"], g["raster"], g["swizzle"], g["cluster"]) == ("auto", "m", 4, (2, 1))
    assert g["choices"]["bf16"][0] == g["tile"] and {"m": 64, "n": 64, "k": 64} in g["choices"]["bf16"]
    assert g["choices"]["f32"] == [g["tiles"]["f32"]]
    assert g["launch_ns"] > 0
    assert set(g["mma"]) == {"issue_cycles_per_k_block", "prologue_cycles", "epilogue_cycles"}
    with pytest.raises(cs.TopologyError, match=r"cube\.pe\.gemm\.cluster: a cluster of 4 x 1 = 4 PEs is larger"):
        cs.load_topology("single_cube", {"cube.pe.gemm": {"cluster": [4, 1]}, "cube.pes": 2})


def test_overrides_change_figures():
    base = cs.load_topology("ring4")
    t = cs.load_topology("ring4", overrides={"network.link.bandwidth_GBps": 64, "cubes.2.clock_scale": 0.5})
    assert all(l["bandwidth_GBps"] == 64 for l in t.links if l["from"] != "host" and l["to"] != "host")
    assert t.cubes[2]["clock_scale"] == 0.5 and t.cubes[1]["clock_scale"] == 1.0
    assert t.cubes[2]["pe"]["clock_GHz"] == pytest.approx(base.cubes[2]["pe"]["clock_GHz"] * 0.5)
    # A list of pairs works too, applied in order.
    t2 = cs.load_topology("ring4", overrides=[("network.link.bandwidth_GBps", 32), ("network.link.bandwidth_GBps", 16)])
    assert {l["bandwidth_GBps"] for l in t2.links if l["from"] != "host" and l["to"] != "host"} == {16}


def test_apply_override_returns_a_copy():
    doc = cs.load_topology_json("single_cube")
    before = json.dumps(doc, sort_keys=True)
    new = cs.apply_override(doc, "cube.hbm.bandwidth_GBps", 4096)
    assert json.dumps(doc, sort_keys=True) == before
    assert new["cube"]["hbm"]["bandwidth_GBps"] == 4096
    t = cs.topology_from_json(new, "sweep point")
    assert t.cubes[0]["hbm"]["bandwidth_GBps"] == 4096
    assert cs.validate_topology(new).cubes[0]["hbm"]["bandwidth_GBps"] == 4096


def test_unknown_override_path_names_the_path_and_suggests():
    doc = cs.load_topology_json("single_cube")
    with pytest.raises(cs.TopologyError, match=r"cube\.hbm.*bandwdth_GBps.*did you mean 'bandwidth_GBps'"):
        cs.apply_override(doc, "cube.hbm.bandwdth_GBps", 1)
    with pytest.raises(cs.TopologyError, match="bandwdth_GBps"):
        cs.load_topology("single_cube", overrides={"cube.hbm.bandwdth_GBps": 1})


def test_load_with_overrides_errors_name_the_override_path():
    with pytest.raises(cs.TopologyError, match=r"override path 'cubes\.16\.clock_scale'.*cubes has 16 entries"):
        cs.load_topology("mesh4x4", overrides={"cubes.16.clock_scale": 0.5})
    with pytest.raises(cs.TopologyError, match=r"\(ring4\): network\.link\.bandwidth_GBps: 0 is not valid"):
        cs.load_topology("ring4", overrides={"network.link.bandwidth_GBps": 0})
    with pytest.raises(cs.TopologyError, match=r"override path 'cube\.id': cube has no field 'id'.*fields there"):
        cs.load_topology("ring4", overrides={"cube.id": 1})


def test_invalid_values_name_the_json_path():
    doc = cs.apply_override(cs.load_topology_json("single_cube"), "network.chunk_bytes", 0)
    with pytest.raises(cs.TopologyError) as e:
        cs.topology_from_json(doc, "mine")
    assert "(mine): network.chunk_bytes: 0 is not valid" in str(e.value)
    assert isinstance(e.value, ValueError)  # TopologyError is a ValueError


def test_validate_file(tmp_path):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(cs.load_topology_json("ring4")))
    assert cs.validate_topology(str(good)).num_cubes == 4
    bad = tmp_path / "bad.json"
    doc = cs.load_topology_json("ring4")
    doc["network"]["link"]["bandwidth_GBps"] = -5
    bad.write_text(json.dumps(doc))
    with pytest.raises(cs.TopologyError, match=r"network\.link\.bandwidth_GBps: -5"):
        cs.validate_topology(str(bad))


def test_unknown_name_lists_the_shipped_ones():
    with pytest.raises(cs.TopologyError, match="unknown topology 'nosuch'.*single_cube"):
        cs.load_topology("nosuch")


def test_json_conversion_rejects_what_json_cannot_hold():
    doc = cs.load_topology_json("single_cube")
    with pytest.raises(TypeError, match="cannot convert"):
        cs.apply_override(doc, "cube.hbm.bandwidth_GBps", object())
    with pytest.raises(TypeError, match="overrides"):
        cs.load_topology("single_cube", overrides="cube.hbm.bandwidth_GBps=3")


def test_hgx_topologies_and_switch_ports():
    for name, hbm in (("h200x8", 4800), ("h100x8", 3350)):
        t = cs.load_topology(name)
        assert t.num_cubes == 8 and t.network == "switch"
        assert t.cubes[0]["hbm"]["bandwidth_GBps"] == hbm
        up = next(l for l in t.links if l["name"] == "c0->sw")
        assert up["bandwidth_GBps"] == 450  # 18 striped links of 25 GB/s
        assert t.sources and "HGX" in t.description
    assert "no NVSwitch" in cs.load_topology("h200x4").description
    # The port figure is a field like any other: overrides reach it.
    slow = cs.load_topology("h200x8", overrides={"network.switch.port.bandwidth_GBps": 10})
    assert slow.doc["network"]["switch"]["port"]["bandwidth_GBps"] == 10
