//! The macro that turns bindgen's function declarations into a lazily resolved table.
//!
//! Bindgen emits `extern "C" { pub fn name(args) -> ret; ... }`; the regeneration step
//! rewrites that one block header into `crate::dylib_fns! {`. Nothing is linked: each
//! entry point is looked up in the module's `LIBRARY` the first time it is asked for,
//! then cached in an `AtomicPtr`, so later calls cost one atomic load and a branch and
//! take no lock.

/// Expands to, inside the module that invokes it:
/// - `pub struct Api`: one cached slot per entry point, and `Api::name(&self)` returning
///   `Result<unsafe extern "C" fn(..) -> .., LoadError>` (the function pointer itself);
/// - `pub fn api() -> Result<&'static Api, LoadError>`: opens the library once;
/// - `pub unsafe fn name(args) -> Result<ret, LoadError>`: looks the entry point up and
///   calls it, for callers who prefer plain calls.
#[doc(hidden)]
#[macro_export]
macro_rules! dylib_fns {
    ($( $(#[$meta:meta])* pub fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) $(-> $ret:ty)? ; )*) => {
        /// Entry points of this library, each resolved on first use and cached.
        #[allow(non_snake_case)]
        pub struct Api {
            library: &'static $crate::loader::Library,
            $( $name: ::core::sync::atomic::AtomicPtr<::core::ffi::c_void>, )*
        }

        impl ::core::fmt::Debug for Api {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                f.debug_struct("Api").field("library", &self.library).finish_non_exhaustive()
            }
        }

        static API: ::std::sync::OnceLock<::core::result::Result<Api, $crate::LoadError>> =
            ::std::sync::OnceLock::new();

        /// Opens this module's library (once per process; the outcome, success or the
        /// error with every path tried, is cached) and returns its entry-point table.
        #[inline]
        pub fn api() -> ::core::result::Result<&'static Api, $crate::LoadError> {
            match API.get_or_init(|| {
                $crate::loader::Library::open(LIBRARY).map(|library| Api {
                    library,
                    $( $name: ::core::sync::atomic::AtomicPtr::new(::core::ptr::null_mut()), )*
                })
            }) {
                Ok(api) => Ok(api),
                Err(e) => Err(e.clone()),
            }
        }

        #[allow(non_snake_case, clippy::missing_safety_doc)]
        impl Api {
            /// The library this table resolves from.
            pub fn library(&self) -> &'static $crate::loader::Library {
                self.library
            }
            $(
                $(#[$meta])*
                #[doc = concat!("The `", stringify!($name), "` entry point, resolved on first use.")]
                #[inline]
                pub fn $name(&self) -> ::core::result::Result<
                    unsafe extern "C" fn($($ty),*) $(-> $ret)?,
                    $crate::LoadError,
                > {
                    let mut p = self.$name.load(::core::sync::atomic::Ordering::Acquire);
                    if p.is_null() {
                        p = self.library.resolve(stringify!($name))?;
                        self.$name.store(p, ::core::sync::atomic::Ordering::Release);
                    }
                    // SAFETY: `p` is the non-null address the library gave for this entry
                    // point, whose C signature is the one bindgen read from the header.
                    Ok(unsafe {
                        ::core::mem::transmute::<
                            *mut ::core::ffi::c_void,
                            unsafe extern "C" fn($($ty),*) $(-> $ret)?,
                        >(p)
                    })
                }
            )*
        }

        $(
            $(#[$meta])*
            #[doc = concat!("Calls `", stringify!($name), "`; `Err` when the library or the entry point is missing.")]
            ///
            /// # Safety
            /// The same as the C function's: valid pointers and handles, as CUDA documents.
            #[allow(non_snake_case, clippy::too_many_arguments)]
            #[inline]
            pub unsafe fn $name($($arg: $ty),*) -> ::core::result::Result<$crate::__ret_ty!($($ret)?), $crate::LoadError> {
                let f = api()?.$name()?;
                // SAFETY: forwarded to the caller, see `# Safety`.
                Ok(unsafe { f($($arg),*) })
            }
        )*
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __ret_ty {
    () => {
        ()
    };
    ($t:ty) => {
        $t
    };
}
