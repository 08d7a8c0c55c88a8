"""Software prefetch for kernels that read per-object rows in an order of their own (an update list's
order, scattered over the handle-ordered object arrays): the row some iterations ahead is requested
from memory while the current one is processed."""
import numba
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


def _prefetch(builder, data, offset, write: bool) -> None:
    """Emit LLVM's prefetch of the cache line at byte ``offset`` from the pointer ``data`` (for writing,
    or with ``write=False`` for reading only; high locality, data cache)."""
    base = builder.ptrtoint(data, cgutils.intp_t)
    addr = builder.inttoptr(builder.add(base, offset), ir.IntType(8).as_pointer())
    i32 = ir.IntType(32)
    fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer(), i32, i32, i32])
    fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
    builder.call(fn, [addr, ir.Constant(i32, int(write)), ir.Constant(i32, 3), ir.Constant(i32, 1)])


def _intrinsic(name: str, flat: bool, write: bool):
    """The typing and code of a prefetch of ``arr`` at ``index``: the first cache line of row ``index``
    (``flat`` False: the index times the first axis's stride), or the line of the element at flat position
    ``index`` of a C-contiguous array (``flat``: the index times the element's size); for writing too, or
    for reading only."""
    def typer(typingctx, arr, index):
        if (not isinstance(arr, types.Array) or not isinstance(index, types.Integer)
                or (flat and arr.layout != "C")):
            return None
        sig = types.void(arr, index)

        def codegen(context, builder, signature, args):
            aty, ity = signature.args
            ary = context.make_array(aty)(context, builder, args[0])
            idx = context.cast(builder, args[1], ity, types.intp)
            if flat:
                step = context.get_constant(types.intp, context.get_abi_sizeof(context.get_data_type(aty.dtype)))
            else:
                step = builder.extract_value(ary.strides, 0)
            _prefetch(builder, ary.data, builder.mul(idx, step), write)
            return context.get_dummy_value()

        return sig, codegen

    typer.__name__ = typer.__qualname__ = name
    return typer


#: Prefetch the first cache line of ``arr[row]`` (2-D C-contiguous array; for writing too).
_prefetch_row = _intrinsic("prefetch_row", flat=False, write=True)
#: The same for rows that are only read: no request for ownership of the line, so a row another core
#: wrote (or reads) stays shared instead of moving to this core.
_prefetch_row_read = _intrinsic("prefetch_row_read", flat=False, write=False)
#: Prefetch the cache line of the element at flat position ``index`` of a C-contiguous array (for writing
#: too): ``arr.ravel()[index]`` without making the view.
_prefetch_flat = _intrinsic("prefetch_flat", flat=True, write=True)


if numba.config.DISABLE_JIT:
    def prefetch_row(arr, row):
        """(Kernels run as Python: nothing to prefetch.)"""

    def prefetch_row_read(arr, row):
        """(Kernels run as Python: nothing to prefetch.)"""

    def prefetch_flat(arr, index):
        """(Kernels run as Python: nothing to prefetch.)"""
else:
    prefetch_row = intrinsic(_prefetch_row)
    prefetch_row_read = intrinsic(_prefetch_row_read)
    prefetch_flat = intrinsic(_prefetch_flat)
