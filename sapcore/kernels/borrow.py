"""A record's field read without a reference of its own, for a kernel that reads many arrays of a record
(``kernels.frame.ListedState``) once per call.

numba reads a structref's array field as a new reference: one atomic increment when read and one atomic
decrement when the variable dies, through two calls into its runtime. ``frame_listed`` reads 34 array
fields a frame; its 65 increments and 85 decrements (a debugger's count) were ~20% of a 100-object
frame's call (3.3 us, by ``perf``): numba's reference-count pruning cannot pair them across the call's
many exits. Read borrowed: 26 and 48 (a null one costs a test and a return), the call 2.8 us.

``borrowed(st, "name")`` returns the field as the record holds it, its meminfo (the reference count's
owner) and parent left out: an array numba counts no references of (as it treats a global array); every
view of it is the same. Valid while the record holds the field, so only in a kernel that neither replaces
the record's fields nor keeps or returns such an array (or a view of it) past its call: the record, an
argument of the call, outlives it; nothing the kernel frees or grows is a borrowed array.
"""
import numba
from numba.core import cgutils, types
from numba.experimental import structref
from numba.extending import intrinsic


def _borrowed(typingctx, st, name):
    """The typing and code of ``borrowed``: ``st`` a structref, ``name`` the literal name of a field."""
    if not isinstance(st, types.StructRef) or not isinstance(name, types.StringLiteral):
        return None
    field = name.literal_value
    if field not in st.field_dict:
        return None
    fty = st.field_dict[field]
    sig = fty(st, name)

    def codegen(context, builder, signature, args):
        data = structref._Utils(context, builder, signature.args[0]).get_data_struct(args[0])
        value = getattr(data, field)
        if not isinstance(fty, types.Array):
            return value                # a number: nothing counted
        ary = context.make_array(fty)(context, builder, value=value)
        ary.meminfo = cgutils.get_null_value(ary.meminfo.type)
        ary.parent = cgutils.get_null_value(ary.parent.type)
        return ary._getvalue()

    return sig, codegen


if numba.config.DISABLE_JIT:
    def borrowed(st, name):
        """(Kernels run as Python: the record's attribute.)"""
        return getattr(st, name)
else:
    borrowed = intrinsic(_borrowed)
