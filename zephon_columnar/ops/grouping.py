"""`DomainGroups`: which mixture components may share a packed row (``homogeneity="group"``).

Grouping only widens which components a row may mix; it never changes the mixture itself.

Example:
    >>> g = DomainGroups({"prose": ["web", "books"]})
    >>> g.to_member_map()
    {'web': 'prose', 'books': 'prose'}
    >>> g.group_of("code")
    'code'
    >>> DomainGroups({"prose": ["web"], "mixed": ["web", "code"]})
    Traceback (most recent call last):
    ...
    zephon_columnar.errors.ConfigError: DomainGroups: component 'web' appears in multiple groups ('prose' and 'mixed'); a component belongs to at most one group.
"""  # noqa: E501 - a doctest's expected exception line is the message verbatim: it cannot wrap

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from zephon_columnar.errors import ConfigError


class DomainGroups:
    """``{group: [component, ...]}``: a component is in at most one group; a component no group
    names is a group of its own. Checked and copied at construction (later changes to the
    caller's mapping do not reach it)."""

    def __init__(self, groups: Mapping[str, Sequence[str]]) -> None:
        if not isinstance(groups, Mapping) or not groups:
            raise ConfigError(
                f"DomainGroups requires at least one group ({{group: [component, ...]}}), got "
                f"{groups!r}; for no grouping pass None."
            )
        members: dict[str, str] = {}
        owned: dict[str, tuple[str, ...]] = {}
        for group, comps in groups.items():
            if not isinstance(group, str) or not group:
                raise ConfigError(f"DomainGroups: group name must be a non-empty string, got {group!r}.")
            if isinstance(comps, str) or not isinstance(comps, Iterable):
                raise ConfigError(
                    f"DomainGroups: group {group!r} members must be a list of component names, "
                    f"not a bare string or scalar {comps!r}."
                )
            listed = list(comps)
            if not listed:
                raise ConfigError(f"DomainGroups: group {group!r} has no member components.")
            for comp in listed:
                if not isinstance(comp, str) or not comp:
                    raise ConfigError(f"DomainGroups: group {group!r} member must be a non-empty string, got {comp!r}.")
                if comp in members:
                    if members[comp] == group:
                        raise ConfigError(f"DomainGroups: component {comp!r} listed twice in group {group!r}.")
                    raise ConfigError(
                        f"DomainGroups: component {comp!r} appears in multiple groups "
                        f"({members[comp]!r} and {group!r}); a component belongs to at most one group."
                    )
                members[comp] = group
            owned[group] = tuple(listed)
        self.groups = owned
        self._members = members

    def to_member_map(self) -> dict[str, str]:
        """``{component: group}`` for the grouped components."""
        return dict(self._members)

    def group_of(self, component: str) -> str:
        return self._members.get(component, component)

    def validate_against(self, known_components: Iterable[str]) -> None:
        """Raise ``ValueError`` if a grouped component is not one of ``known_components``."""
        known = set(known_components)
        unknown = sorted(set(self._members) - known)
        if unknown:
            raise ConfigError(
                f"DomainGroups references components not in the mixture: {unknown}. Known components: {sorted(known)}."
            )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DomainGroups) and other.groups == self.groups

    def __repr__(self) -> str:
        return f"DomainGroups({self.groups!r})"


__all__ = ["DomainGroups"]
