//! A restricted reader of Python pickles: enough of the pickle machine to read a PyTorch
//! state dict, and nothing that could run code.
//!
//! A pickle is a program for a small stack machine; unpickling it with Python's `pickle`
//! calls whatever callables the program names (`GLOBAL os system` + `REDUCE` runs a shell
//! command). This reader never calls anything. It knows a fixed allow-list of names — the
//! ones `torch.save` of a state dict uses: `collections.OrderedDict`, the tensor rebuild
//! functions of `torch._utils`, and the typed storage classes of `torch` — and turns a
//! `REDUCE` of one of them into plain data (a dictionary, a tensor description). Any other
//! global, and every opcode that builds arbitrary objects (`INST`, `OBJ`, `NEWOBJ`,
//! `NEWOBJ_EX`, extension registry codes), is refused with an error naming it, before
//! anything further is read. Memo, stack and nesting are bounded.
//!
//! Supported: protocols 0–5 as `torch.save` and `pickle.dump` write containers, strings,
//! numbers, booleans and `None`; persistent ids (`BINPERSID`, PyTorch's storage
//! references). Reference: CPython's `Lib/pickletools.py` (the opcode table) and
//! `torch/serialization.py` (what a saved state dict contains).

use std::collections::HashMap;

/// Largest memo index and stack depth accepted.
const MAX_MEMO: usize = 1 << 24;
const MAX_STACK: usize = 1 << 20;

/// The element types of PyTorch's typed storages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TorchDtype {
    F32,
    F16,
    BF16,
    F64,
    I64,
    I32,
    I16,
    I8,
    U8,
    Bool,
}

impl TorchDtype {
    /// The dtype of the storage class `torch.<name>`.
    fn from_storage(name: &str) -> Option<TorchDtype> {
        Some(match name {
            "FloatStorage" => TorchDtype::F32,
            "HalfStorage" => TorchDtype::F16,
            "BFloat16Storage" => TorchDtype::BF16,
            "DoubleStorage" => TorchDtype::F64,
            "LongStorage" => TorchDtype::I64,
            "IntStorage" => TorchDtype::I32,
            "ShortStorage" => TorchDtype::I16,
            "CharStorage" => TorchDtype::I8,
            "ByteStorage" => TorchDtype::U8,
            "BoolStorage" => TorchDtype::Bool,
            _ => return None,
        })
    }

    /// Bytes per element.
    pub fn size(self) -> u64 {
        match self {
            TorchDtype::F64 | TorchDtype::I64 => 8,
            TorchDtype::F32 | TorchDtype::I32 => 4,
            TorchDtype::F16 | TorchDtype::BF16 | TorchDtype::I16 => 2,
            TorchDtype::I8 | TorchDtype::U8 | TorchDtype::Bool => 1,
        }
    }
}

/// A storage a tensor views: the archive record `data/<key>` holding `numel` elements.
#[derive(Clone, Debug, PartialEq)]
pub struct StorageRef {
    pub dtype: TorchDtype,
    pub key: String,
    pub numel: u64,
}

/// A tensor as `torch._utils._rebuild_tensor_v2` describes it.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorRef {
    pub storage: StorageRef,
    /// Elements into the storage.
    pub offset: u64,
    /// Outermost first, as PyTorch orders them.
    pub shape: Vec<u64>,
    pub stride: Vec<u64>,
}

/// The callables a pickle may name.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Callable {
    OrderedDict,
    RebuildTensor,
    RebuildParameter,
    Storage(TorchDtype),
}

/// What the allow-list maps `module.name` to, if anything.
fn allowed(module: &str, name: &str) -> Option<Callable> {
    match (module, name) {
        ("collections", "OrderedDict") => Some(Callable::OrderedDict),
        ("torch._utils", "_rebuild_tensor_v2") => Some(Callable::RebuildTensor),
        ("torch._utils", "_rebuild_parameter") => Some(Callable::RebuildParameter),
        ("torch", storage) => TorchDtype::from_storage(storage).map(Callable::Storage),
        _ => None,
    }
}

/// A value on the machine's stack.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    Tuple(Vec<Value>),
    List(Vec<Value>),
    Dict(Vec<(Value, Value)>),
    Tensor(TensorRef),
    /// Allow-listed callables and storage references, which only live on the stack.
    Callable(CallableValue),
    Storage(StorageRef),
}

/// An allow-listed callable as a value (opaque outside this module).
#[derive(Clone, Debug, PartialEq)]
pub struct CallableValue(Callable);

/// Why a pickle was refused: the message, and the byte offset of the opcode at fault.
#[derive(Debug, PartialEq)]
pub struct PickleError {
    pub offset: usize,
    pub msg: String,
}

type Res<T> = std::result::Result<T, PickleError>;

/// Runs the pickle `data` and returns the value it builds.
pub fn load(data: &[u8]) -> Res<Value> {
    Machine {
        data,
        pos: 0,
        op_at: 0,
        stack: Vec::new(),
        marks: Vec::new(),
        memo: HashMap::new(),
    }
    .run()
}

struct Machine<'a> {
    data: &'a [u8],
    pos: usize,
    /// Offset of the opcode being run (for errors).
    op_at: usize,
    stack: Vec<Value>,
    /// Stack lengths at each MARK.
    marks: Vec<usize>,
    memo: HashMap<usize, Value>,
}

impl Machine<'_> {
    fn err<T>(&self, msg: impl Into<String>) -> Res<T> {
        Err(PickleError {
            offset: self.op_at,
            msg: msg.into(),
        })
    }

    fn take(&mut self, n: usize) -> Res<&[u8]> {
        match self.pos.checked_add(n) {
            Some(end) if end <= self.data.len() => {
                let s = &self.data[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            _ => self.err("the pickle ends inside an opcode's argument"),
        }
    }

    fn u8(&mut self) -> Res<u8> {
        Ok(self.take(1)?[0])
    }

    fn le<const N: usize>(&mut self) -> Res<[u8; N]> {
        let mut b = [0u8; N];
        b.copy_from_slice(self.take(N)?);
        Ok(b)
    }

    /// A length argument that must fit in what is left of the pickle.
    fn len(&mut self, n: u64) -> Res<usize> {
        match usize::try_from(n) {
            Ok(n) if n <= self.data.len() - self.pos => Ok(n),
            _ => self.err(format!("a length of {n} bytes runs past the pickle's end")),
        }
    }

    /// A newline-terminated line (text-mode arguments).
    fn line(&mut self) -> Res<String> {
        let rest = &self.data[self.pos..];
        let Some(n) = rest.iter().position(|&b| b == b'\n') else {
            return self.err("the pickle ends inside a line argument");
        };
        let s = String::from_utf8_lossy(&rest[..n]).into_owned();
        self.pos += n + 1;
        Ok(s)
    }

    fn text(&mut self, n: usize) -> Res<Value> {
        let b = self.take(n)?;
        match std::str::from_utf8(b) {
            Ok(s) => Ok(Value::Str(s.to_string())),
            Err(_) => self.err("a string is not valid UTF-8"),
        }
    }

    fn push(&mut self, v: Value) -> Res<()> {
        if self.stack.len() >= MAX_STACK {
            return self.err("the stack grows past its limit");
        }
        self.stack.push(v);
        Ok(())
    }

    fn pop(&mut self) -> Res<Value> {
        if self.marks.last().is_some_and(|&m| m >= self.stack.len()) {
            return self.err("an opcode pops past a MARK");
        }
        match self.stack.pop() {
            Some(v) => Ok(v),
            None => self.err("an opcode pops an empty stack"),
        }
    }

    /// Everything pushed since the last MARK.
    fn pop_mark(&mut self) -> Res<Vec<Value>> {
        let Some(m) = self.marks.pop() else {
            return self.err("no MARK to pop to");
        };
        Ok(self.stack.split_off(m))
    }

    fn top(&mut self) -> Res<&mut Value> {
        if self.marks.last().is_some_and(|&m| m >= self.stack.len()) {
            return self.err("an opcode reads past a MARK");
        }
        let at = self.op_at;
        self.stack.last_mut().ok_or(PickleError {
            offset: at,
            msg: "an opcode reads an empty stack".into(),
        })
    }

    fn memo_put(&mut self, i: usize) -> Res<()> {
        if i >= MAX_MEMO {
            return self.err(format!("memo index {i} past the limit"));
        }
        let v = self.top()?.clone();
        self.memo.insert(i, v);
        Ok(())
    }

    fn memo_get(&mut self, i: usize) -> Res<()> {
        match self.memo.get(&i) {
            Some(v) => {
                let v = v.clone();
                self.push(v)
            }
            None => self.err(format!("memo index {i} was never stored")),
        }
    }

    fn global(&mut self, module: &str, name: &str) -> Res<()> {
        match allowed(module, name) {
            Some(c) => self.push(Value::Callable(CallableValue(c))),
            None => self.err(format!(
                "the pickle names the global '{module}.{name}', which is not allowed in a \
                 checkpoint (only a state dict of tensors is read; nothing in the file is run)"
            )),
        }
    }

    fn run(mut self) -> Res<Value> {
        loop {
            self.op_at = self.pos;
            let op = self.u8()?;
            match op {
                b'\x80' => {
                    let proto = self.u8()?;
                    if proto > 5 {
                        return self.err(format!("pickle protocol {proto} is not known"));
                    }
                }
                b'\x95' => {
                    self.le::<8>()?; // FRAME: a length hint only
                }
                b'.' => return self.pop(),
                b'(' => {
                    if self.marks.len() >= MAX_STACK {
                        return self.err("too many MARKs");
                    }
                    self.marks.push(self.stack.len())
                }
                b'0' => {
                    self.pop()?;
                }
                b'1' => {
                    self.pop_mark()?;
                }
                b'2' => {
                    let v = self.top()?.clone();
                    self.push(v)?
                }
                // Constants and numbers.
                b'N' => self.push(Value::None)?,
                b'\x88' => self.push(Value::Bool(true))?,
                b'\x89' => self.push(Value::Bool(false))?,
                b'J' => {
                    let v = i32::from_le_bytes(self.le()?);
                    self.push(Value::Int(v as i64))?
                }
                b'K' => {
                    let v = self.u8()?;
                    self.push(Value::Int(v as i64))?
                }
                b'M' => {
                    let v = u16::from_le_bytes(self.le()?);
                    self.push(Value::Int(v as i64))?
                }
                b'\x8a' => {
                    let n = self.u8()? as usize;
                    let b = self.take(n)?;
                    if n > 8 {
                        return self.err("an integer wider than 64 bits");
                    }
                    let mut v: i64 = 0;
                    for (i, &x) in b.iter().enumerate() {
                        v |= (x as i64) << (8 * i);
                    }
                    if n > 0 && n < 8 && b[n - 1] & 0x80 != 0 {
                        v -= 1i64 << (8 * n);
                    }
                    self.push(Value::Int(v))?
                }
                b'G' => {
                    let v = f64::from_be_bytes(self.le()?);
                    self.push(Value::Float(v))?
                }
                b'I' => {
                    let l = self.line()?;
                    let v = match l.as_str() {
                        "00" => Value::Bool(false),
                        "01" => Value::Bool(true),
                        s => match s.parse::<i64>() {
                            Ok(i) => Value::Int(i),
                            Err(_) => return self.err(format!("INT '{s}' is not an integer")),
                        },
                    };
                    self.push(v)?
                }
                // Strings and bytes.
                b'X' => {
                    let n = u32::from_le_bytes(self.le()?) as u64;
                    let n = self.len(n)?;
                    let v = self.text(n)?;
                    self.push(v)?
                }
                b'\x8c' => {
                    let n = self.u8()? as usize;
                    let v = self.text(n)?;
                    self.push(v)?
                }
                b'\x8d' => {
                    let n = u64::from_le_bytes(self.le()?);
                    let n = self.len(n)?;
                    let v = self.text(n)?;
                    self.push(v)?
                }
                b'S' => {
                    // A quoted Python string literal (protocol 0); escapes are kept as
                    // written (no state dict key needs them).
                    let l = self.line()?;
                    let b = l.as_bytes();
                    let quoted =
                        b.len() >= 2 && (b[0] == b'\'' || b[0] == b'"') && b[b.len() - 1] == b[0];
                    if !quoted {
                        return self.err("STRING argument is not a quoted string");
                    }
                    self.push(Value::Str(l[1..l.len() - 1].to_string()))?
                }
                b'B' | b'C' | b'\x8e' | b'T' | b'U' => {
                    let n = match op {
                        b'B' | b'T' => u32::from_le_bytes(self.le()?) as u64,
                        b'\x8e' => u64::from_le_bytes(self.le()?),
                        _ => self.u8()? as u64,
                    };
                    let n = self.len(n)?;
                    let b = self.take(n)?.to_vec();
                    self.push(Value::Bytes(b))?
                }
                // Containers.
                b')' => self.push(Value::Tuple(Vec::new()))?,
                b']' => self.push(Value::List(Vec::new()))?,
                b'}' => self.push(Value::Dict(Vec::new()))?,
                b't' => {
                    let items = self.pop_mark()?;
                    self.push(Value::Tuple(items))?
                }
                b'l' => {
                    let items = self.pop_mark()?;
                    self.push(Value::List(items))?
                }
                b'd' => {
                    let items = self.pop_mark()?;
                    let pairs = self.pairs(items)?;
                    self.push(Value::Dict(pairs))?
                }
                b'\x85' | b'\x86' | b'\x87' => {
                    let n = (op - b'\x84') as usize;
                    let mut items = Vec::with_capacity(n);
                    for _ in 0..n {
                        items.push(self.pop()?);
                    }
                    items.reverse();
                    self.push(Value::Tuple(items))?
                }
                b'a' => {
                    let v = self.pop()?;
                    match self.top()? {
                        Value::List(l) => l.push(v),
                        _ => return self.err("APPEND to something that is not a list"),
                    }
                }
                b'e' => {
                    let items = self.pop_mark()?;
                    match self.top()? {
                        Value::List(l) => l.extend(items),
                        _ => return self.err("APPENDS to something that is not a list"),
                    }
                }
                b's' => {
                    let v = self.pop()?;
                    let k = self.pop()?;
                    match self.top()? {
                        Value::Dict(d) => d.push((k, v)),
                        _ => return self.err("SETITEM on something that is not a dict"),
                    }
                }
                b'u' => {
                    let items = self.pop_mark()?;
                    let pairs = self.pairs(items)?;
                    match self.top()? {
                        Value::Dict(d) => d.extend(pairs),
                        _ => return self.err("SETITEMS on something that is not a dict"),
                    }
                }
                // The memo.
                b'p' => {
                    let l = self.line()?;
                    let i = self.index(&l)?;
                    self.memo_put(i)?
                }
                b'q' => {
                    let i = self.u8()? as usize;
                    self.memo_put(i)?
                }
                b'r' => {
                    let i = u32::from_le_bytes(self.le()?) as usize;
                    self.memo_put(i)?
                }
                b'\x94' => {
                    let i = self.memo.len();
                    self.memo_put(i)?
                }
                b'g' => {
                    let l = self.line()?;
                    let i = self.index(&l)?;
                    self.memo_get(i)?
                }
                b'h' => {
                    let i = self.u8()? as usize;
                    self.memo_get(i)?
                }
                b'j' => {
                    let i = u32::from_le_bytes(self.le()?) as usize;
                    self.memo_get(i)?
                }
                // Names and calls: allow-listed only.
                b'c' => {
                    let module = self.line()?;
                    let name = self.line()?;
                    self.global(&module, &name)?
                }
                b'\x93' => {
                    let name = self.pop()?;
                    let module = self.pop()?;
                    match (module, name) {
                        (Value::Str(m), Value::Str(n)) => self.global(&m, &n)?,
                        _ => return self.err("STACK_GLOBAL of values that are not strings"),
                    }
                }
                b'Q' => {
                    let pid = self.pop()?;
                    let s = self.storage(pid)?;
                    self.push(Value::Storage(s))?
                }
                b'R' => {
                    let args = self.pop()?;
                    let f = self.pop()?;
                    let v = self.call(f, args)?;
                    self.push(v)?
                }
                b'b' => {
                    // BUILD: an object's state. Only a state dict's own attributes
                    // (`_metadata`) are met here, and they are dropped.
                    let _state = self.pop()?;
                    match self.top()? {
                        Value::Dict(_) | Value::Tensor(_) => {}
                        _ => return self.err("BUILD on something that is not a dict or tensor"),
                    }
                }
                b'i' | b'o' | b'\x81' | b'\x92' => {
                    return self.err(format!(
                        "opcode {} builds an arbitrary object, which a checkpoint never needs",
                        op_name(op)
                    ));
                }
                b'\x82' | b'\x83' | b'\x84' => {
                    return self.err("extension registry codes are not allowed");
                }
                b'P' => return self.err("text persistent ids are not used by PyTorch"),
                _ => {
                    return self.err(format!("unknown or unsupported pickle opcode 0x{op:02x}"));
                }
            }
        }
    }

    fn index(&self, line: &str) -> Res<usize> {
        match line.trim().parse::<usize>() {
            Ok(i) => Ok(i),
            Err(_) => self.err(format!("memo index '{line}' is not a number")),
        }
    }

    fn pairs(&self, items: Vec<Value>) -> Res<Vec<(Value, Value)>> {
        if !items.len().is_multiple_of(2) {
            return self.err("an odd number of items for a dict");
        }
        let mut it = items.into_iter();
        let mut out = Vec::new();
        while let (Some(k), Some(v)) = (it.next(), it.next()) {
            out.push((k, v));
        }
        Ok(out)
    }

    /// PyTorch's persistent id of a storage: `('storage', <storage class>, key, location,
    /// numel)`.
    fn storage(&self, pid: Value) -> Res<StorageRef> {
        let Value::Tuple(t) = pid else {
            return self.err("a persistent id that is not a tuple");
        };
        match t.as_slice() {
            [
                Value::Str(tag),
                Value::Callable(CallableValue(Callable::Storage(dtype))),
                Value::Str(key),
                _,
                Value::Int(numel),
            ] if tag == "storage" && *numel >= 0 => Ok(StorageRef {
                dtype: *dtype,
                key: key.clone(),
                numel: *numel as u64,
            }),
            _ => self.err("a persistent id that is not a PyTorch storage reference"),
        }
    }

    fn call(&self, f: Value, args: Value) -> Res<Value> {
        let Value::Callable(CallableValue(f)) = f else {
            return self.err("REDUCE of something that is not an allowed callable");
        };
        let Value::Tuple(args) = args else {
            return self.err("REDUCE with arguments that are not a tuple");
        };
        match f {
            Callable::OrderedDict => match args.as_slice() {
                [] => Ok(Value::Dict(Vec::new())),
                [Value::List(items)] | [Value::Tuple(items)] => {
                    let mut pairs = Vec::new();
                    for it in items {
                        match it {
                            Value::Tuple(kv) if kv.len() == 2 => {
                                pairs.push((kv[0].clone(), kv[1].clone()))
                            }
                            _ => return self.err("OrderedDict of items that are not pairs"),
                        }
                    }
                    Ok(Value::Dict(pairs))
                }
                _ => self.err("OrderedDict with unexpected arguments"),
            },
            Callable::RebuildTensor => match args.as_slice() {
                [
                    Value::Storage(s),
                    Value::Int(offset),
                    Value::Tuple(size),
                    Value::Tuple(stride),
                    ..,
                ] if *offset >= 0 => {
                    let dims = |v: &[Value]| -> Option<Vec<u64>> {
                        v.iter()
                            .map(|d| match d {
                                Value::Int(i) if *i >= 0 => Some(*i as u64),
                                _ => None,
                            })
                            .collect()
                    };
                    match (dims(size), dims(stride)) {
                        (Some(shape), Some(stride)) if shape.len() == stride.len() => {
                            Ok(Value::Tensor(TensorRef {
                                storage: s.clone(),
                                offset: *offset as u64,
                                shape,
                                stride,
                            }))
                        }
                        _ => self.err("a tensor whose size or stride is not a list of counts"),
                    }
                }
                _ => self.err("_rebuild_tensor_v2 with unexpected arguments"),
            },
            Callable::RebuildParameter => match args.into_iter().next() {
                Some(t @ Value::Tensor(_)) => Ok(t),
                _ => self.err("_rebuild_parameter of something that is not a tensor"),
            },
            Callable::Storage(_) => self.err("a storage class called directly"),
        }
    }
}

fn op_name(op: u8) -> &'static str {
    match op {
        b'i' => "INST",
        b'o' => "OBJ",
        b'\x81' => "NEWOBJ",
        b'\x92' => "NEWOBJ_EX",
        _ => "?",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containers_numbers_and_memo() {
        // pickle.dumps({'a': [1, -2, 300, 70000, 2**40, -(2**40)], 'b': (True, None, 1.5)},
        // protocol=2)
        let p = b"\x80\x02}q\x00(X\x01\x00\x00\x00aq\x01]q\x02(K\x01J\xfe\xff\xff\xffM,\x01J\
p\x11\x01\x00\x8a\x06\x00\x00\x00\x00\x00\x01\x8a\x06\x00\x00\x00\x00\x00\xffeX\x01\x00\
\x00\x00bq\x03\x88NG?\xf8\x00\x00\x00\x00\x00\x00\x87q\x04u.";
        let v = load(p).unwrap();
        assert_eq!(
            v,
            Value::Dict(vec![
                (
                    Value::Str("a".into()),
                    Value::List(vec![
                        Value::Int(1),
                        Value::Int(-2),
                        Value::Int(300),
                        Value::Int(70000),
                        Value::Int(1 << 40),
                        Value::Int(-(1 << 40)),
                    ])
                ),
                (
                    Value::Str("b".into()),
                    Value::Tuple(vec![Value::Bool(true), Value::None, Value::Float(1.5)])
                ),
            ])
        );
    }

    #[test]
    fn forbidden_globals_and_opcodes_are_refused() {
        // cos\nsystem\n(S'echo hi'\ntR.  (protocol 0 os.system)
        let e = load(b"cos\nsystem\n(S'echo hi'\ntR.").unwrap_err();
        assert!(e.msg.contains("'os.system'"), "{}", e.msg);
        assert_eq!(e.offset, 0);
        // STACK_GLOBAL builtins.eval
        let e = load(b"\x80\x04\x8c\x08builtins\x8c\x04eval\x93.").unwrap_err();
        assert!(e.msg.contains("'builtins.eval'"), "{}", e.msg);
        let e = load(b"\x80\x02(ctorch._utils\n_rebuild_tensor_v2\n\x81.").unwrap_err();
        assert!(e.msg.contains("NEWOBJ"), "{}", e.msg);
        assert!(load(b"\x80\x02").unwrap_err().msg.contains("ends"));
        assert!(
            load(b"\x80\x02X\xff\xff\xff\xff")
                .unwrap_err()
                .msg
                .contains("past")
        );
        assert!(
            load(b"\x80\x02h\x05.")
                .unwrap_err()
                .msg
                .contains("never stored")
        );
        assert!(load(b"\x80\x02(0.").unwrap_err().msg.contains("MARK"));
    }
}
