"""Consumer groups on multi-partition topic keys (membership). Placeholder."""


def groups_view(ctx, topic, group):
    return []
