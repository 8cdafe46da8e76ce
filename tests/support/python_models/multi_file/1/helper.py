OFFSET = 1000
calls = 0


def add_offset(x):
    global calls
    calls += 1
    return x + OFFSET
