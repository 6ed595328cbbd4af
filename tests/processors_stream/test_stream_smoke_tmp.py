from stream_rig import group_events, interleave


def test_smoke(make_stream_rig):
    rig = make_stream_rig()
    events = interleave(group_events("g1", ["The answer is 4", "The answer is 5", "4", "no idea"]))
    expected = rig.expected(events)
    rig.produce(events)
    rig.start_worker()
    got = rig.collect(lambda c: len(c.ids("Sample")) >= len(expected["Sample"]), timeout_s=60)
    for name in expected:
        assert got.ids(name) == set(expected[name]), name
    print(rig.log_tail())
