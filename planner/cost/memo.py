"""Memoized methods that hold their object weakly.

`functools.cache(self._method)` kept on `self` is a reference cycle (the object holds the cache,
which holds the bound method, which holds the object), so the object and everything its memos
hold outlive the last reference to it until Python's cyclic collector runs a full collection,
and every collection in between walks them. A search leaves hundreds of thousands of memo
entries on its evaluator (issue 16): held weakly, they go with the evaluator, by reference
counting alone.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from functools import cache, partial
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

_T = TypeVar("_T")
_P = ParamSpec("_P")
_R = TypeVar("_R")


def weak_method(obj: _T, method: Callable[Concatenate[_T, _P], _R]) -> Callable[_P, _R]:
    """`method` (a function of the class of `obj`) bound to `obj` through a weak proxy: it may
    be kept by `obj` or by what `obj` holds without a reference cycle (calling it once `obj`
    is gone raises `ReferenceError`)."""
    return partial(method, cast(Any, weakref.proxy(obj)))


def memo_method(obj: _T, method: Callable[Concatenate[_T, _P], _R]) -> Callable[_P, _R]:
    """`functools.cache` of `weak_method(obj, method)`: a memoized method that `obj` may keep."""
    return cast(Callable[_P, _R], cache(weak_method(obj, method)))
